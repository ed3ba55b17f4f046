//! Every `clawback-trainer` command the book and the README show is one the trainer accepts:
//! each is run as `clawback-trainer ARGS --help`.

#[path = "../../tests/src/book_commands.rs"]
mod book_commands;

use std::path::Path;

#[test]
fn every_trainer_command_the_book_shows_is_one_the_trainer_accepts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let trainer = Path::new(env!("CARGO_BIN_EXE_clawback-trainer"));
    let (checked, refused) = book_commands::refused_with_help(&root, trainer, |shown| {
        shown.args_of("clawback-trainer").map(<[String]>::to_vec)
    });
    assert!(
        checked >= 3,
        "the book shows {checked} clawback-trainer commands"
    );
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}
