//! `redis-server` processes of a test's own on free loopback ports — a single server (optionally
//! durable, optionally restarted on the same port to simulate an outage) or a 3-master cluster —
//! killed when their guard drops, also when the test panics. Shared by the datapool's tests
//! (included by path) and the whole-system tests.
#![allow(dead_code)] // each test binary uses a different part

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"))
        .port()
}

/// Waits up to `within` for `ready` to hold, polling.
pub fn wait_until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a server answers on `port` (an auth error is an answer too).
fn ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "ping"])
        .output()
        .map(|o| {
            let out = String::from_utf8_lossy(&o.stdout);
            out.contains("PONG") || out.contains("NOAUTH")
        })
        .unwrap_or(false)
}

/// A `redis-server` of this test's own, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(free_port(), Vec::new())
    }

    /// A server that keeps every acknowledged write on disk in `dir` (append-only file, fsync
    /// per write), so a killed and restarted server still has what it acknowledged.
    pub fn start_durable(dir: &Path) -> Self {
        Self::start_with(free_port(), durable_args(dir))
    }

    /// A server started with extra `redis-server` arguments (e.g. `--requirepass`).
    pub fn start_with_args(args: &[&str]) -> Self {
        Self::start_with(free_port(), args.iter().map(|a| a.to_string()).collect())
    }

    /// A port where no server runs yet; `restart` starts one there.
    pub fn not_started(dir: &Path) -> Self {
        RedisServer {
            port: free_port(),
            child: None,
            extra: durable_args(dir),
        }
    }

    /// Started on `port`, or on another free port if that one was taken in the meantime (by
    /// another test's server: a port is free when picked, not when the server binds it).
    fn start_with(port: u16, extra: Vec<String>) -> Self {
        let mut server = RedisServer {
            port,
            child: None,
            extra,
        };
        for _ in 0..3 {
            match server.spawn() {
                Ok(()) => return server,
                Err(exited) => {
                    eprintln!("{exited}; trying another port");
                    server.port = free_port();
                }
            }
        }
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: no goodbye to clients) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: it keeps nothing on disk).
    pub fn restart(&mut self) {
        if let Err(exited) = self.spawn() {
            panic!("{exited}");
        }
    }

    /// Starts the server on its port and waits until it answers; `Err` says how it exited if
    /// it did instead (e.g. the port was taken).
    fn spawn(&mut self) -> Result<(), String> {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--save", "", "--daemonize", "no", "--bind", "127.0.0.1"])
            .args(if self.extra.iter().any(|a| a == "--appendonly") {
                &[][..]
            } else {
                &["--appendonly", "no"][..]
            })
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server: {e}"));
        self.child = Some(child);
        let port = self.port;
        let mut exited = None;
        wait_until("redis-server answers PING", Duration::from_secs(30), || {
            exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            exited.is_some() || ping(port)
        });
        match exited {
            Some(status) => {
                self.child = None;
                Err(format!("redis-server on port {port} exited: {status}"))
            }
            None => Ok(()),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-master Redis Cluster on loopback ports, killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let nodes: Vec<RedisServer> = (0..3)
            .map(|i| {
                let conf = dir.path().join(format!("nodes-{i}.conf"));
                RedisServer::start_with(free_port(), cluster_args(&conf, dir.path()))
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster create: {e}"));
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for node in &nodes {
            let port = node.port.to_string();
            wait_until("cluster_state:ok", Duration::from_secs(60), || {
                Command::new("redis-cli")
                    .args(["-p", &port, "cluster", "info"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
                    .unwrap_or(false)
            });
        }
        RedisCluster { nodes, _dir: dir }
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

fn durable_args(dir: &Path) -> Vec<String> {
    [
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        &dir.display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// A cluster node's arguments; its bus port is a free port of its own (Redis's default, the
/// node's port + 10,000, is past 65,535 for ports above 55,535, which loopback hands out).
fn cluster_args(conf: &Path, dir: &Path) -> Vec<String> {
    vec![
        "--cluster-enabled".into(),
        "yes".into(),
        "--cluster-port".into(),
        free_port().to_string(),
        "--cluster-config-file".into(),
        conf.display().to_string(),
        "--dir".into(),
        dir.display().to_string(),
    ]
}
