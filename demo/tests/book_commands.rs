//! Every `scripts/run` command the book and the README show is one `clawback-demo` accepts:
//! each is run as `clawback-demo ARGS --help` (what `scripts/run` passes on, `--release` aside).
//! (`scripts/run sidecar ...` is the sidecar's, checked by tests/tests/book.)

#[path = "../../tests/src/book_commands.rs"]
mod book_commands;

use std::path::Path;

#[test]
fn every_scripts_run_command_the_book_shows_is_one_the_demo_accepts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let demo = Path::new(env!("CARGO_BIN_EXE_clawback-demo"));
    let (checked, refused) = book_commands::refused_with_help(&root, demo, |shown| {
        let args = shown.args_of("scripts/run")?;
        (args.first().map(String::as_str) != Some("sidecar"))
            .then(|| args.iter().filter(|a| *a != "--release").cloned().collect())
    });
    assert!(
        checked >= 10,
        "the book shows {checked} scripts/run commands"
    );
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}
