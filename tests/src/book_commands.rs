//! The commands the book and the README show — in their shell blocks and in inline code on one
//! line — as the argument lists a shell would pass, for the tests that hold them to the command
//! lines they name (`clawback-sidecar`'s, `clawback-trainer`'s, `scripts/run`'s).

use std::path::{Path, PathBuf};

/// A command a page shows: the page (relative to the repository) and its words, the variables
/// set for it (`KEY=value cmd`) left out.
#[derive(Debug, Clone)]
pub struct Shown {
    pub page: String,
    pub words: Vec<String>,
}

impl Shown {
    /// The command's arguments when its program is `program` (or a path ending in it).
    pub fn args_of(&self, program: &str) -> Option<&[String]> {
        let (first, rest) = self.words.split_first()?;
        (first == program || first.ends_with(&format!("/{program}"))).then_some(rest)
    }
}

/// Every command the README and the book's pages (`docs/src`, with what they include) show,
/// but those with a placeholder (`[ARGS]`, `<command>`, `...`): such a line shows a form, not a
/// command.
pub fn shown_commands(root: &Path) -> Vec<Shown> {
    let mut pages = vec![root.join("README.md")];
    pages.extend(files_under(&root.join("docs/src"), "md"));
    let mut found = Vec::new();
    for page in pages {
        let text = with_includes(&page);
        let name = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for line in shell_lines(&text).into_iter().chain(inline_code(&text)) {
            let words: Vec<String> = words(&line)
                .into_iter()
                .skip_while(|w| w.contains('=') && !w.starts_with('-'))
                .collect();
            if !words.is_empty() && !words.iter().any(|w| is_placeholder(w)) {
                found.push(Shown {
                    page: name.clone(),
                    words,
                });
            }
        }
    }
    found
}

fn is_placeholder(word: &str) -> bool {
    word.starts_with('[') || word.starts_with('<') || word.contains("...") || word.contains('…')
}

/// A page's text with mdBook's `{{#include file}}` lines replaced by the file.
fn with_includes(page: &Path) -> String {
    let text =
        std::fs::read_to_string(page).unwrap_or_else(|e| panic!("reading {}: {e}", page.display()));
    text.lines()
        .map(|line| {
            let included = line
                .trim()
                .strip_prefix("{{#include ")
                .and_then(|rest| rest.strip_suffix("}}"))
                .map(|file| page.parent().unwrap_or(page).join(file.trim()));
            match included {
                Some(file) => std::fs::read_to_string(&file).unwrap_or_else(|e| {
                    panic!("{} includes {}: {e}", page.display(), file.display())
                }),
                None => line.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines of Markdown text outside its fenced code blocks.
pub fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// Inline code on one line (`` `...` ``) outside code blocks.
fn inline_code(text: &str) -> Vec<String> {
    let mut spans = Vec::new();
    for line in prose_lines(text) {
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            spans.push(code.to_owned());
        }
    }
    spans
}

/// Runs `binary ARGS --help` for every command the pages show that `args` turns into the
/// binary's arguments (`None`: not one of its commands); clap refuses a command, an option or a
/// value that does not exist before it reaches `--help`. Returns how many were run and what
/// each refused one said.
pub fn refused_with_help(
    root: &Path,
    binary: &Path,
    args: impl Fn(&Shown) -> Option<Vec<String>>,
) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut refused = Vec::new();
    for shown in shown_commands(root) {
        let Some(args) = args(&shown) else {
            continue;
        };
        let output = std::process::Command::new(binary)
            .args(&args)
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", binary.display()));
        checked += 1;
        if !output.status.success() {
            refused.push(format!(
                "{}: `{}`: {}",
                shown.page,
                shown.words.join(" "),
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .next()
                    .unwrap_or_default()
            ));
        }
    }
    (checked, refused)
}

/// The command lines of the `sh`, `bash` and `console` blocks, continuations joined and a
/// `$ ` prompt dropped.
fn shell_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_shell = None;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            in_shell = match in_shell {
                Some(_) => None,
                None => Some(matches!(lang.trim(), "sh" | "bash" | "console" | "shell")),
            };
            continue;
        }
        if in_shell != Some(true) {
            continue;
        }
        let line = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    lines
}

/// A command line's words as the shell splits them, up to a comment, a pipe, a redirection or
/// the next command; quotes removed, variables left as written.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                started = true;
            }
            (None, '#') if !started => break,
            (None, '|' | '>' | '<' | ';' | '&') => break,
            (None, c) if c.is_whitespace() => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (None, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

/// Every file under `dir` whose name ends in `.{extension}`, sorted.
pub fn files_under(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path, extension));
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
    found.sort();
    found
}
