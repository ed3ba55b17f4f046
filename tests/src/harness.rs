//! Starts a real sidecar on a loopback port inside the test process, over real HTTP, with a
//! configuration made for tests: port 0, short timeouts, given upstreams.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clawback_sidecar::app::App;
use clawback_sidecar::config::Config;
use clawback_sidecar::data_plane::server;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A sidecar serving in this process until [`Sidecar::shutdown`] or drop.
pub struct Sidecar {
    pub addr: SocketAddr,
    /// The admin listener's address, when `admin.listen` is set.
    pub admin_addr: Option<SocketAddr>,
    pub app: Arc<App>,
    stop: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<()>>,
}

/// The test configuration: listen on any loopback port, forward to `upstreams`.
pub fn test_config(upstreams: &[String]) -> Config {
    let mut config = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        upstreams: upstreams.to_vec(),
        data_dir: scratch_dir("sidecar-data"),
        ..Config::default()
    };
    config.timeouts.upstream_connect = Duration::from_millis(500);
    config.timeouts.upstream_first_byte = Duration::from_secs(30);
    config.timeouts.upstream_idle = Duration::from_secs(30);
    config.timeouts.shutdown_grace = Duration::from_secs(10);
    config.log.filter = "warn".to_owned();
    config
}

impl Sidecar {
    pub async fn start(config: Config) -> Self {
        let listener = server::bind(config.listen).await.expect("sidecar binds");
        let addr = listener.local_addr().expect("sidecar has an address");
        let mut listeners = vec![(listener, server::Port::Agent)];
        let mut admin_addr = None;
        if let Some(admin) = config.admin.listen {
            let admin = server::bind(admin).await.expect("admin listener binds");
            admin_addr = Some(admin.local_addr().expect("admin listener has an address"));
            listeners.push((admin, server::Port::Admin));
        }
        let app = App::new(config).await.expect("valid test config");
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(clawback_sidecar::app::serve_on(
            listeners,
            Arc::clone(&app),
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            admin_addr,
            app,
            stop: Some(stop),
            serving: Some(serving),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The OpenAI `base_url` an agent would be given.
    pub fn base_url(&self) -> String {
        self.url("/v1")
    }

    /// Starts the graceful shutdown; the returned handle resolves when draining is done.
    pub fn begin_shutdown(&mut self) -> JoinHandle<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.serving
            .take()
            .unwrap_or_else(|| tokio::spawn(async {}))
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A fresh directory under the system temp dir, unique to this process and call.
pub fn scratch_dir(what: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("clawback-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The repository root, for fixtures and the example config.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// The venv python that has the official OpenAI and Anthropic Python SDKs (`scripts/test`
/// installs them; `CLAWBACK_SDK_PYTHON` overrides).
pub fn sdk_python() -> PathBuf {
    std::env::var_os("CLAWBACK_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/clawback/sdk-venv/bin/python")
        })
}

/// Runs an agent script (an official SDK as the client) to its end; its stdout. Panics with its
/// output when it fails, or when it did not print `ok <case>` for each of `cases` (what the
/// scripts print per check).
pub async fn run_client(mut command: std::process::Command, what: &str, cases: &[&str]) -> String {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .unwrap_or_else(|e| panic!("{what} did not start ({e}); run scripts/test"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for case in cases {
        assert!(
            stdout.contains(&format!("ok {case}")),
            "{what} skipped {case}:\n{stdout}"
        );
    }
    stdout
}

/// The JSON a script printed on its `{prefix} ` line.
pub fn printed_json(stdout: &str, prefix: &str) -> serde_json::Value {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(' '))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{stdout}"))
}

/// The folder whose `node_modules` has the official Node SDKs (`scripts/test` runs `npm ci`
/// there; `CLAWBACK_SDK_NODE_DIR` overrides).
pub fn sdk_node_dir() -> PathBuf {
    std::env::var_os("CLAWBACK_SDK_NODE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tests/sdk/node"))
}
