//! A sidecar as a process of its own — the `clawback-sidecar` CLI, as deployments run it — that
//! a test can SIGKILL and start again on the same port and data folder.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `clawback-sidecar serve` child process; killed when dropped.
pub struct SidecarProcess {
    binary: PathBuf,
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
}

impl SidecarProcess {
    /// Starts `binary serve --listen addr --data-dir data_dir ARGS` and waits until it answers
    /// `/healthz`. Its output goes to `data_dir/../sidecar-<port>.log`.
    pub async fn start(binary: &Path, addr: SocketAddr, data_dir: &Path, args: &[&str]) -> Self {
        let log = data_dir.with_file_name(format!("sidecar-{}.log", addr.port()));
        let mut process = SidecarProcess {
            binary: binary.to_path_buf(),
            addr,
            data_dir: data_dir.to_path_buf(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            child: None,
            log,
        };
        process.spawn().await;
        process
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("sidecar log file");
        let err = log.try_clone().expect("sidecar log file");
        let child = Command::new(&self.binary)
            .arg("serve")
            .arg("--listen")
            .arg(self.addr.to_string())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.args)
            // Only the flags configure it, whatever the environment running the tests says.
            .env_remove("CLAWBACK_CONFIG")
            .env_remove("CLAWBACK_REDIS")
            .env_remove("CLAWBACK_UPSTREAM")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .expect("the sidecar binary starts");
        self.child = Some(child);
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://{}/healthz", self.addr);
        loop {
            if let Ok(response) = reqwest_lite_get(&url).await {
                if response == 200 {
                    return;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("the sidecar exited ({status}):\n{}", self.logs());
                }
            }
            assert!(
                Instant::now() < deadline,
                "the sidecar did not answer within 30 s:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGKILL: no shutdown, no flush — whatever the process held in memory is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with the same port, data folder and flags.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// What it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The status of a GET, over a plain HTTP/1.1 connection (no client library needed here).
async fn reqwest_lite_get(url: &str) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await?;
    let status = std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok(status)
}
