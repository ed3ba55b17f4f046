//! Finds the tools the deploy checks run — kubectl (for kustomize), kubernetes-validate, Envoy —
//! in the venv that `scripts/lib.sh`'s `ensure_deploy_tools` fills from PyPI.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The venv's `bin` folder: `$CLAWBACK_DEPLOY_TOOLS`, else `$CLAWBACK_CACHE/deploy-venv/bin`,
/// else `~/.cache/clawback/deploy-venv/bin`.
fn tools_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CLAWBACK_DEPLOY_TOOLS") {
        return Some(PathBuf::from(dir));
    }
    let cache = std::env::var_os("CLAWBACK_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/clawback")))?;
    Some(cache.join("deploy-venv/bin"))
}

/// The path of one tool; panics, saying how to install it, when it is not there.
pub fn deploy_tool(name: &str) -> PathBuf {
    match tools_dir().map(|dir| dir.join(name)) {
        Some(path) if path.is_file() => path,
        other => panic!(
            "{name} not found (looked for {}): scripts/test installs the deploy tools \
             (`source scripts/lib.sh && ensure_deploy_tools`)",
            other.map(|p| p.display().to_string()).unwrap_or_default()
        ),
    }
}

/// Runs a tool; its stdout on success, else everything it said.
pub fn run_tool(name: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(deploy_tool(name))
        .args(args)
        .output()
        .map_err(|e| format!("running {name}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{name} {} failed ({}):\n{stdout}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Every document of a multi-document YAML text, as JSON values (parsed by the venv's PyYAML,
/// the parser kubernetes-validate itself uses).
pub fn yaml_documents(yaml: &str) -> Vec<Value> {
    use std::io::Write as _;
    let mut child = Command::new(deploy_tool("python"))
        .args([
            "-c",
            "import sys, json, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the deploy venv's python starts");
    child
        .stdin
        .take()
        .expect("python's stdin")
        .write_all(yaml.as_bytes())
        .expect("YAML to python");
    let output = child.wait_with_output().expect("python finishes");
    assert!(output.status.success(), "the YAML does not parse");
    match serde_json::from_slice(&output.stdout) {
        Ok(Value::Array(documents)) => documents,
        other => panic!("python did not print a JSON list: {other:?}"),
    }
}
