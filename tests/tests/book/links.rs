//! The book as mdBook builds it, and every link in it: each relative `href` and `src` of every
//! page names a file the build wrote, and each `#anchor` an id on that page. The README's links
//! into the book are checked the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// mdBook as `scripts/test` installs it: `$CLAWBACK_MDBOOK`, else under `$CLAWBACK_CACHE` (or
/// `~/.cache/clawback`).
fn mdbook() -> PathBuf {
    if let Some(path) = std::env::var_os("CLAWBACK_MDBOOK") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("CLAWBACK_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/clawback")))
        .unwrap_or_default();
    let path = cache.join("mdbook/bin/mdbook");
    assert!(
        path.is_file(),
        "mdbook not found at {}: scripts/test installs it (`source scripts/lib.sh && ensure_mdbook`)",
        path.display()
    );
    path
}

/// Builds the book from `docs/` into `out`; fails on any error or warning mdBook prints.
pub fn build(root: &Path, out: &Path) {
    let output = Command::new(mdbook())
        .arg("build")
        .arg(root.join("docs"))
        .arg("--dest-dir")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("running mdbook: {e}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "mdbook build failed:\n{said}");
    let warnings: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(
        warnings.is_empty(),
        "mdbook warned:\n{}",
        warnings.join("\n")
    );
}

/// Every page the build wrote, with the ids on it.
pub struct Site {
    root: PathBuf,
    ids: BTreeMap<PathBuf, BTreeSet<String>>,
}

impl Site {
    pub fn read(root: &Path) -> Self {
        let mut ids = BTreeMap::new();
        for page in clawback_tests::book_commands::files_under(root, "html") {
            let text = std::fs::read_to_string(&page)
                .unwrap_or_else(|e| panic!("reading {}: {e}", page.display()));
            ids.insert(page, attribute_values(&text, "id").into_iter().collect());
        }
        Self {
            root: root.to_owned(),
            ids,
        }
    }

    /// The pages a reader reaches from the table of contents (not the print view, whose links
    /// mdBook rewrites into itself, nor the 404 page, whose links are absolute to the site).
    pub fn pages(&self) -> impl Iterator<Item = &PathBuf> {
        self.ids.keys().filter(|p| {
            !matches!(
                p.file_name().and_then(|n| n.to_str()),
                Some("print.html" | "404.html" | "toc.html")
            )
        })
    }

    /// What is wrong with `target`, a link on `from` (an HTML page of the site), if anything.
    pub fn broken(&self, from: &Path, target: &str) -> Option<String> {
        if is_external(target) {
            return None;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
        let path = path.split('?').next().unwrap_or_default();
        let file = if path.is_empty() {
            from.to_owned()
        } else {
            normalise(&from.parent().unwrap_or(&self.root).join(path))
        };
        if !file.starts_with(&self.root) {
            return Some(format!("{target}: outside the book"));
        }
        if !file.is_file() {
            return Some(format!("{target}: no such file in the book"));
        }
        if anchor.is_empty() {
            return None;
        }
        match self.ids.get(&file) {
            Some(ids) if ids.contains(anchor) => None,
            Some(_) => Some(format!("{target}: no id {anchor:?} on that page")),
            None => None,
        }
    }

    /// The ids of the page built from `docs/src/<source>` (a `.md` path).
    pub fn ids_of_source(&self, source: &Path) -> Option<&BTreeSet<String>> {
        self.ids.get(&self.root.join(source.with_extension("html")))
    }
}

/// Every `href` and `src` on a page.
pub fn links(page: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(page).unwrap_or_else(|e| panic!("reading {}: {e}", page.display()));
    let mut found = attribute_values(&text, "href");
    found.extend(attribute_values(&text, "src"));
    found
}

/// Markdown links `[text](target)` in a file's text, code spans and blocks left out.
pub fn markdown_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    for line in clawback_tests::book_commands::prose_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            links.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    links
}

pub fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:", "javascript:", "data:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

/// The values of `name="..."` attributes in HTML text, entities of `&amp;` decoded.
fn attribute_values(text: &str, name: &str) -> Vec<String> {
    let needle = format!(" {name}=\"");
    text.match_indices(&needle)
        .filter_map(|(at, _)| {
            let value = &text[at + needle.len()..];
            let end = value.find('"')?;
            Some(value[..end].replace("&amp;", "&"))
        })
        .collect()
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
