//! A page's generated part: the text between two markers, rendered from the code. A test
//! compares it with what the code renders now; `CLAWBACK_BLESS=1` writes the new rendering into
//! the page instead, for a change that is meant.

use std::path::Path;

const BEGIN: &str =
    "<!-- generated from the code by tests/tests/book (CLAWBACK_BLESS=1 rewrites it): begin -->";
const END: &str = "<!-- generated: end -->";

/// Fails, with the first line that differs, when the generated part of `page` is not
/// `rendered`; with `CLAWBACK_BLESS=1`, rewrites it.
pub fn check(page: &Path, rendered: &str) {
    let text =
        std::fs::read_to_string(page).unwrap_or_else(|e| panic!("reading {}: {e}", page.display()));
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        panic!(
            "{} has no generated part (the markers {BEGIN:?} and {END:?})",
            page.display()
        );
    };
    let inner = begin + BEGIN.len();
    let written = text[inner..end].trim();
    let rendered = rendered.trim();
    if written == rendered {
        return;
    }
    if std::env::var_os("CLAWBACK_BLESS").is_some() {
        let updated = format!("{}\n\n{rendered}\n\n{}", &text[..inner], &text[end..]);
        std::fs::write(page, updated).unwrap_or_else(|e| panic!("writing {}: {e}", page.display()));
        return;
    }
    let differs = written
        .lines()
        .zip(rendered.lines())
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("the page says\n  {a}\nthe code says\n  {b}"))
        .unwrap_or_else(|| {
            format!(
                "the page has {} lines, the code renders {}",
                written.lines().count(),
                rendered.lines().count()
            )
        });
    panic!(
        "{} disagrees with the code: {differs}\n(run the test with CLAWBACK_BLESS=1 to rewrite it)",
        page.display()
    );
}
