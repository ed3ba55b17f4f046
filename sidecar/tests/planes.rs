//! The sidecar's two planes depend one way (see `src/lib.rs`): the data plane imports nothing
//! of the control plane nor of the composition root, and the control plane nothing of the root.
//! Checked on the source, so that an arrow back up fails here with the line that draws it.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The code lines (not comments) of the files under `plane` that name one of `forbidden`.
fn arrows_back(plane: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(plane);
    let files = sources(&root);
    assert!(
        files.len() > 3,
        "{} holds {} files",
        root.display(),
        files.len()
    );
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for module in forbidden {
                if code.contains(&format!("crate::{module}")) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn the_data_plane_imports_nothing_of_the_control_plane_or_the_root() {
    let back = arrows_back(
        "data_plane",
        &["control_plane", "app", "config", "cli", "telemetry"],
    );
    assert!(
        back.is_empty(),
        "the data plane imports upwards:\n{}",
        back.join("\n")
    );
}

#[test]
fn the_control_plane_imports_nothing_of_the_root() {
    let back = arrows_back("control_plane", &["app", "config", "cli", "telemetry"]);
    assert!(
        back.is_empty(),
        "the control plane imports upwards:\n{}",
        back.join("\n")
    );
}
