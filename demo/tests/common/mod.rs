//! What the demo tests share: the demo binary with the parts it starts (the test crate's
//! `sidecar`, the trainer built beside it, the release plugins), and the charts' checks.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A binary built with the workspace's tests (`cargo test --workspace`), beside the demo's.
fn beside_demo(name: &str, package: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_clawback-demo")).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: cargo build -p {package} --bin {name}",
        path.display()
    );
    path
}

/// `clawback-demo --dir <dir>` with the sidecar, the trainer, the reference engine and the
/// plugins it needs (vLLM's Python the demo finds itself: `CLAWBACK_VLLM_PYTHON`, inherited).
pub fn demo(dir: &Path) -> Command {
    let plugins =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../wasm-plugins/target/wasm32-wasip2/release");
    assert!(
        plugins.join("letter_case.wasm").is_file(),
        "{} has no plugins: cd wasm-plugins && cargo build --release --target wasm32-wasip2",
        plugins.display()
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_clawback-demo"));
    command
        .arg("--dir")
        .arg(dir)
        .arg("--sidecar")
        .arg(beside_demo("sidecar", "clawback-tests"))
        .arg("--trainer")
        .arg(beside_demo("clawback-trainer", "clawback-trainer"))
        .arg("--serve")
        .arg(beside_demo("clawback-serve", "clawback-serve"))
        .arg("--plugins")
        .arg(plugins);
    command
}

/// `<base>.svg` is an SVG with lines drawn and `<base>.png` a PNG.
pub fn assert_chart(base: &Path) {
    let svg = std::fs::read_to_string(base.with_extension("svg")).expect("the SVG chart");
    assert!(
        svg.starts_with("<svg") && svg.contains("polyline"),
        "{svg:.300}"
    );
    let png = std::fs::read(base.with_extension("png")).expect("the PNG chart");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

/// Runs `command` (a [`demo`] writing into `dir`), which must succeed; the summary it wrote
/// and what it printed (the context of every failed check).
pub fn run(mut command: Command, dir: &Path) -> (Value, String) {
    let output = command.output().expect("the demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("{stdout}\n{stderr}");
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{context}",
        output.status
    );
    let summary = serde_json::from_str(
        &std::fs::read_to_string(dir.join("summary.json")).expect("summary.json"),
    )
    .expect("summary.json parses");
    (summary, context)
}
