//! The processes a bench run starts — the engine, the proxies measured, Redis — and what they
//! cost, read from `/proc`: CPU time and resident memory of a whole process tree (NGINX's
//! workers, LiteLLM's uvicorn worker count with their parent).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A child process killed on drop, so a failed run leaves nothing behind.
pub struct Process(pub Child);

impl Process {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // The whole tree: NGINX's workers and LiteLLM's worker are our child's children.
        for pid in descendants(self.0.id()) {
            // SAFETY: kill(2) with a pid read from /proc; at worst the pid is gone (ESRCH).
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A command, on one CPU when asked (through `taskset`).
pub fn command(binary: &Path, cpu: Option<u32>) -> Command {
    match cpu {
        Some(cpu) => {
            let mut taskset = Command::new("taskset");
            taskset.arg("-c").arg(cpu.to_string()).arg(binary);
            taskset
        }
        None => Command::new(binary),
    }
}

/// Starts `binary` and reads the address it serves on from its first line of output, which
/// starts with `banner`.
pub fn spawn(
    binary: &Path,
    args: &[&str],
    banner: &str,
    cpu: Option<u32>,
) -> Result<(Process, String), String> {
    use std::io::{BufRead, BufReader};
    let mut child = command(binary, cpu)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e} (run scripts/bench)", binary.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let url = line
        .trim()
        .strip_prefix(banner)
        .ok_or_else(|| format!("{} printed {line:?}", binary.display()))?
        .to_owned();
    Ok((Process(child), url))
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Waits until something accepts connections on `port`, or `process` exits.
fn listening(process: &mut Process, port: u16, within: Duration, what: &str) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    while started.elapsed() < within {
        if let Ok(Some(status)) = process.0.try_wait() {
            return Err(format!("{what} exited with {status} before it served"));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{what} did not listen on {addr} within {within:?}"))
}

/// A `redis-server` on a free port, not persisting anything.
pub fn start_redis() -> Result<(Process, String), String> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server: {e}"))?;
    let mut process = Process(child);
    listening(&mut process, port, Duration::from_secs(5), "redis-server")?;
    Ok((process, format!("redis://127.0.0.1:{port}")))
}

/// NGINX as a plain reverse proxy in front of `upstream`: keep-alive to the engine, nothing
/// buffered (so streams pass event by event), no access log; one worker per CPU it may use.
pub fn start_nginx(
    upstream: &str,
    dir: &Path,
    cpu: Option<u32>,
) -> Result<(Process, String), String> {
    let binary = clawback_tests::front_door::find_nginx()
        .ok_or("nginx not found: scripts/bench installs it (apt-get install nginx)")?;
    let upstream = upstream
        .strip_prefix("http://")
        .ok_or_else(|| format!("the engine's address {upstream} is not http://"))?;
    let port = free_port()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let d = dir.display();
    let config = format!(
        "daemon off;\nworker_processes auto;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
         upstream engine {{ server {upstream}; keepalive 256; keepalive_requests 1000000; }}\n  \
         server {{\n    listen 127.0.0.1:{port};\n    client_max_body_size 16m;\n    \
         location / {{\n      proxy_pass http://engine;\n      proxy_http_version 1.1;\n      \
         proxy_set_header Connection \"\";\n      proxy_buffering off;\n      \
         proxy_request_buffering off;\n    }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
    let child = command(&binary, cpu)
        .arg("-c")
        .arg(&path)
        .arg("-e")
        .arg(dir.join("error.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start nginx: {e}"))?;
    let mut process = Process(child);
    listening(&mut process, port, Duration::from_secs(10), "nginx")?;
    Ok((process, format!("http://127.0.0.1:{port}")))
}

/// The master key the bench's LiteLLM proxy checks (it refuses to start without one).
const LITELLM_KEY: &str = "sk-clawback-bench";
/// The `authorization` header value of every bench request.
pub const LITELLM_BEARER: &str = "Bearer sk-clawback-bench";

/// The LiteLLM proxy (one worker, no database) with one model, `model`, routed to the engine
/// as an OpenAI-compatible endpoint.
pub fn start_litellm(
    litellm: &Path,
    engine: &str,
    model: &str,
    dir: &Path,
    cpu: Option<u32>,
) -> Result<(Process, String), String> {
    let port = free_port()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let config = format!(
        "model_list:\n  - model_name: {model}\n    litellm_params:\n      model: openai/{model}\n      \
         api_base: {engine}/v1\n      api_key: unused\nlitellm_settings:\n  telemetry: false\n  \
         drop_params: true\n"
    );
    let path = dir.join("litellm.yaml");
    std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
    let child = command(litellm, cpu)
        .arg("--config")
        .arg(&path)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--num_workers", "1"])
        .env("LITELLM_MASTER_KEY", LITELLM_KEY)
        .env("LITELLM_LOG", "ERROR")
        .env("LITELLM_TELEMETRY", "False")
        .env("NO_DOCS", "True")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", litellm.display()))?;
    let mut process = Process(child);
    // Importing LiteLLM takes a while.
    listening(&mut process, port, Duration::from_secs(180), "litellm")?;
    Ok((process, format!("http://127.0.0.1:{port}")))
}

/// `pid` and every process below it.
pub fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    all.extend(descendants(pid));
    all
}

fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?.ppid)))
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in &parents {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

struct Stat {
    ppid: u32,
    /// User + system CPU time, in clock ticks.
    ticks: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it are plain.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // Fields 4 (ppid), 14 (utime) and 15 (stime) of proc(5), counted after the name.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        ppid: u32::try_from(field(4)?).ok()?,
        ticks: field(14)? + field(15)?,
    })
}

/// CPU time a process tree has used so far, in milliseconds.
pub fn cpu_ms(root: u32) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks: u64 = tree(root)
        .into_iter()
        .filter_map(stat)
        .map(|s| s.ticks)
        .sum();
    ticks as f64 * 1000.0 / hz
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Peak resident memory of a process tree, sampled every 50 ms until dropped.
pub struct RssSampler {
    peak_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssSampler {
    pub fn start(root: u32) -> Self {
        let peak_kib = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (peak, stopped) = (Arc::clone(&peak_kib), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let kib: u64 = tree(root).into_iter().filter_map(rss_kib).sum();
                peak.fetch_max(kib, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self { peak_kib, stop }
    }

    pub fn peak_mib(&self) -> f64 {
        self.peak_kib.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
