//! The `clawback-sidecar` commands the book and the README show, as `clawback-sidecar` gets
//! them: `clawback-sidecar ...` itself, and `scripts/run sidecar ...`, whose arguments go to
//! `clawback-sidecar serve`.

use std::path::Path;

use clawback_tests::book_commands::shown_commands;

/// (the page, the sidecar's arguments, its name first) for every such command.
pub fn sidecar_commands(root: &Path) -> Vec<(String, Vec<String>)> {
    shown_commands(root)
        .into_iter()
        .filter_map(|shown| {
            let program = "clawback-sidecar".to_owned();
            let args: Vec<String> = match (
                shown.args_of("clawback-sidecar"),
                shown.args_of("scripts/run"),
            ) {
                (Some(args), _) => args.to_vec(),
                (None, Some([sidecar, args @ ..])) if sidecar == "sidecar" => {
                    std::iter::once("serve".to_owned())
                        .chain(args.iter().cloned())
                        .collect()
                }
                _ => return None,
            };
            Some((shown.page, std::iter::once(program).chain(args).collect()))
        })
        .collect()
}
