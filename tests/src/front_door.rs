//! Real front doors — NGINX and Envoy — as child processes of a test, configured from the files
//! in `deploy/` with only their addresses replaced, so what a test checks is the shipped config.
//!
//! Nothing is skipped when a binary is missing: the test fails and says how to install it
//! (`scripts/test` does).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::deploy_tools::deploy_tool;
use crate::harness::{repo_root, scratch_dir};

/// A front door serving on `addr` until dropped.
pub struct FrontDoor {
    pub addr: SocketAddr,
    child: Child,
    dir: PathBuf,
}

impl FrontDoor {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What the process wrote to its logs, for failure messages.
    pub fn logs(&self) -> String {
        read_logs(&self.dir)
    }
}

impl Drop for FrontDoor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `deploy/nginx/clawback.conf` with its sidecar pool and listen address replaced.
///
/// Fails (rather than test something else) when the file no longer has the shape this expects:
/// one `upstream clawback_sidecars` block with `server` lines and one `listen 8080;`.
pub fn nginx_site(
    shipped: &str,
    sidecars: &[SocketAddr],
    listen: SocketAddr,
) -> Result<String, String> {
    let mut out = Vec::new();
    let mut in_pool = false;
    let (mut servers_seen, mut listens) = (0, 0);
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("upstream clawback_sidecars {") {
            in_pool = true;
        } else if in_pool && trimmed.starts_with('}') {
            in_pool = false;
        } else if in_pool && trimmed.starts_with("server ") {
            // Keep the shipped parameters (max_fails, ...), swap the address.
            let params: Vec<&str> = trimmed
                .trim_end_matches(';')
                .split_whitespace()
                .skip(2)
                .collect();
            if servers_seen == 0 {
                for sidecar in sidecars {
                    out.push(format!("    server {sidecar} {};", params.join(" ")));
                }
            }
            servers_seen += 1;
            continue;
        } else if trimmed == "listen 8080;" {
            listens += 1;
            out.push(format!("    listen {listen};"));
            continue;
        }
        out.push(line.to_owned());
    }
    if servers_seen == 0 || listens != 1 {
        return Err(format!(
            "deploy/nginx/clawback.conf changed shape: {servers_seen} server lines in \
             `upstream clawback_sidecars`, {listens} `listen 8080;` lines"
        ));
    }
    Ok(out.join("\n"))
}

/// The main nginx.conf a test runs: foreground, one process, every path in `dir`, and the site
/// file included in `http { }` as the deploy docs say.
fn nginx_main(dir: &Path, site: &Path) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  \
         proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  \
         scgi_temp_path {d}/scgi;\n  include {};\n}}\n",
        site.display()
    )
}

/// The nginx binary: `CLAWBACK_NGINX`, else on `PATH`, else Debian's `/usr/sbin/nginx`.
pub fn find_nginx() -> Option<PathBuf> {
    std::env::var_os("CLAWBACK_NGINX")
        .map(PathBuf::from)
        .or_else(|| which("nginx"))
        .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.exists()))
}

fn nginx_binary() -> PathBuf {
    find_nginx().unwrap_or_else(|| {
        panic!(
            "nginx not found (not on PATH, not /usr/sbin/nginx, CLAWBACK_NGINX unset): \
             scripts/test installs it (`apt-get install nginx`)"
        )
    })
}

/// Checks the shipped site file as it is, with `nginx -t`.
pub fn nginx_check(site: &Path) -> Result<(), String> {
    let dir = scratch_dir("nginx-check");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let main = dir.join("nginx.conf");
    std::fs::write(&main, nginx_main(&dir, site)).map_err(|e| e.to_string())?;
    let output = Command::new(nginx_binary())
        .arg("-t")
        .arg("-c")
        .arg(&main)
        .arg("-e")
        .arg(dir.join("error.log"))
        .output()
        .map_err(|e| format!("running nginx -t: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// A real nginx in front of `sidecars`, configured from `deploy/nginx/clawback.conf`.
pub async fn start_nginx(sidecars: &[SocketAddr]) -> FrontDoor {
    let shipped = std::fs::read_to_string(repo_root().join("deploy/nginx/clawback.conf"))
        .expect("deploy/nginx/clawback.conf is readable");
    start_nginx_site(|listen| {
        nginx_site(&shipped, sidecars, listen).unwrap_or_else(|e| panic!("{e}"))
    })
    .await
}

/// NGINX in front of `engine` compressing every answer whose client accepts gzip, as a hop
/// between the sidecar and an engine might (a gateway with `gzip on`).
pub async fn start_compressing_hop(engine: SocketAddr) -> FrontDoor {
    start_nginx_site(|listen| {
        format!(
            "server {{\n  listen {listen};\n  gzip on;\n  gzip_types *;\n  gzip_proxied any;\n  \
             gzip_min_length 0;\n  location / {{\n    proxy_pass http://{engine};\n    \
             proxy_http_version 1.1;\n    proxy_buffering off;\n  }}\n}}\n"
        )
    })
    .await
}

/// NGINX serving the site `render` writes for the address it listens on.
async fn start_nginx_site(render: impl Fn(SocketAddr) -> String) -> FrontDoor {
    let render = &render;
    on_a_free_port("nginx", |listen| async move {
        let dir = scratch_dir("nginx");
        std::fs::create_dir_all(&dir).expect("nginx scratch dir");
        let site = dir.join("clawback.conf");
        std::fs::write(&site, render(listen)).expect("write nginx site");
        let main = dir.join("nginx.conf");
        std::fs::write(&main, nginx_main(&dir, &site)).expect("write nginx.conf");
        let child = Command::new(nginx_binary())
            .arg("-c")
            .arg(&main)
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts");
        serving(child, listen, dir).await
    })
    .await
}

/// A front door started by `start` on a port that was free when picked. Parallel tests race for
/// ports between the pick and the bind: when the one picked was taken meanwhile, again on
/// another (three tries).
async fn on_a_free_port<F, Fut>(what: &str, mut start: F) -> FrontDoor
where
    F: FnMut(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Result<FrontDoor, String>>,
{
    let mut last = String::new();
    for _ in 0..3 {
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        match start(listen).await {
            Ok(door) => return door,
            Err(logs) if logs.contains("Address already in use") => last = logs,
            Err(logs) => panic!("{what} did not serve:\n{logs}"),
        }
    }
    panic!("{what} found its port taken three times:\n{last}");
}

/// `deploy/envoy/envoy.yaml` with its listener and sidecar endpoints replaced.
///
/// Fails when the file no longer has the expected shape: one `port_value: 8080` (the listener,
/// whose `address: 0.0.0.0` becomes loopback) and the list of sidecar endpoints right after a
/// `# sidecars:` comment. The admin port (9901) becomes 0.
pub fn envoy_config(
    shipped: &str,
    sidecars: &[SocketAddr],
    listen: SocketAddr,
) -> Result<String, String> {
    let mut out: Vec<String> = Vec::new();
    let mut listens = 0;
    let mut lines = shipped.lines().peekable();
    let mut pools = 0;
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed == "address: 0.0.0.0" {
            out.push(format!("{indent}address: {}", listen.ip()));
        } else if trimmed == "port_value: 8080" {
            listens += 1;
            out.push(format!("{indent}port_value: {}", listen.port()));
        } else if trimmed == "port_value: 9901" {
            // The admin port: any free one, so that tests can run several Envoys at once.
            out.push(format!("{indent}port_value: 0"));
        } else if trimmed.starts_with("# sidecars:") {
            pools += 1;
            out.push(line.to_owned());
            // Drop the shipped endpoints (every line indented deeper than the marker's list).
            let mut list_indent = None;
            while let Some(next) = lines.peek() {
                let next_trimmed = next.trim_start();
                let next_indent = next.len() - next_trimmed.len();
                if next_trimmed.is_empty() {
                    lines.next();
                    continue;
                }
                let li = *list_indent.get_or_insert(next_indent);
                if next_indent < li || (next_indent == li && !next_trimmed.starts_with("- ")) {
                    break;
                }
                lines.next();
            }
            let pad = " ".repeat(list_indent.unwrap_or(indent.len()));
            for sidecar in sidecars {
                out.push(format!("{pad}- endpoint:"));
                out.push(format!("{pad}    address:"));
                out.push(format!("{pad}      socket_address:"));
                out.push(format!("{pad}        address: {}", sidecar.ip()));
                out.push(format!("{pad}        port_value: {}", sidecar.port()));
            }
        } else {
            out.push(line.to_owned());
        }
    }
    if listens != 1 || pools != 1 {
        return Err(format!(
            "deploy/envoy/envoy.yaml changed shape: {listens} `port_value: 8080` lines, \
             {pools} `# sidecars:` markers"
        ));
    }
    Ok(out.join("\n"))
}

fn envoy_binary() -> PathBuf {
    deploy_tool("envoy")
}

/// Validates an Envoy config file with `envoy --mode validate`.
pub fn envoy_check(config: &Path) -> Result<(), String> {
    let output = Command::new(envoy_binary())
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(config)
        .output()
        .map_err(|e| format!("running envoy --mode validate: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// A real Envoy in front of `sidecars`, configured from `deploy/envoy/envoy.yaml`.
pub async fn start_envoy(sidecars: &[SocketAddr]) -> FrontDoor {
    let shipped = std::fs::read_to_string(repo_root().join("deploy/envoy/envoy.yaml"))
        .expect("deploy/envoy/envoy.yaml is readable");
    let shipped = &shipped;
    on_a_free_port("envoy", |listen| async move {
        let dir = scratch_dir("envoy");
        std::fs::create_dir_all(&dir).expect("envoy scratch dir");
        let config = dir.join("envoy.yaml");
        let rendered = envoy_config(shipped, sidecars, listen).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&config, rendered).expect("write envoy.yaml");
        let log = std::fs::File::create(dir.join("error.log")).expect("envoy log file");
        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&config)
            // Several Envoys may run at once (parallel tests): no shared memory between them.
            .args(["--disable-hot-restart", "-l", "warning", "--log-path"])
            .arg(dir.join("envoy.log"))
            .arg("--admin-address-path")
            .arg(dir.join("admin-address"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("envoy starts");
        let mut envoy = serving(child, listen, dir).await?;
        envoy_ready(&mut envoy).await?;
        Ok(envoy)
    })
    .await
}

/// Waits (bounded) until Envoy's admin `/ready` says LIVE: its listener port may accept before
/// its workers serve.
async fn envoy_ready(envoy: &mut FrontDoor) -> Result<(), String> {
    use std::io::{Read as _, Write as _};
    let mut last = String::new();
    for _ in 0..600 {
        // Another process may hold the port Envoy failed to bind: the port answering is not
        // Envoy answering.
        if let Ok(Some(status)) = envoy.child.try_wait() {
            return Err(format!("envoy exited with {status}:\n{}", envoy.logs()));
        }
        let admin = std::fs::read_to_string(envoy.dir.join("admin-address")).unwrap_or_default();
        if let Ok(mut stream) = TcpStream::connect(admin.trim()) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = stream
                .write_all(b"GET /ready HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
            last.clear();
            let _ = stream.read_to_string(&mut last);
            if last.starts_with("HTTP/1.1 200") {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "envoy never became ready: {last}\n{}",
        envoy.logs()
    ))
}

/// Waits (bounded) until `child` accepts connections on `listen`; panics with its logs if it
/// exits or never does.
async fn serving(mut child: Child, listen: SocketAddr, dir: PathBuf) -> Result<FrontDoor, String> {
    for _ in 0..600 {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "front door exited with {status}:\n{}",
                read_logs(&dir)
            ));
        }
        if TcpStream::connect_timeout(&listen, Duration::from_millis(100)).is_ok() {
            return Ok(FrontDoor {
                addr: listen,
                child,
                dir,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    Err(format!(
        "front door never listened on {listen}:\n{}",
        read_logs(&dir)
    ))
}

fn read_logs(dir: &Path) -> String {
    ["error.log", "envoy.log"]
        .iter()
        .filter_map(|name| std::fs::read_to_string(dir.join(name)).ok())
        .collect::<Vec<_>>()
        .join("\n")
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}
