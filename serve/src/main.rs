//! `clawback-serve`: the reference engine — a model folder served over an OpenAI-compatible
//! HTTP API in vLLM's shapes, with runtime LoRA loading (vLLM's endpoints) and full-weight
//! updates (SGLang's). See the library's docs.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use clawback_model::model::Placement;
use clawback_serve::{ServeOptions, Server};

/// Serves a model folder over an OpenAI-compatible HTTP API in vLLM's shapes, with runtime
/// LoRA loading (vLLM's endpoints) and full-weight updates (SGLang's).
#[derive(Parser)]
#[command(name = "clawback-serve", version)]
struct Cli {
    /// An HF folder: config.json, safetensors, tokenizer.json, tokenizer_config.json.
    #[arg(long)]
    model: PathBuf,
    /// A PEFT adapter to serve from the start, as NAME=DIR (repeatable).
    #[arg(long = "adapter", value_parser = parse_adapter)]
    adapters: Vec<(String, PathBuf)>,
    /// The base model's name in requests and /v1/models (default: the --model path).
    #[arg(long)]
    served_model_name: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[arg(long, default_value = "auto")]
    device: Placement,
    /// Sequences decoded at once (one token each per round); later requests queue.
    #[arg(long, default_value_t = 16)]
    max_num_seqs: usize,
    /// CPU threads for libtorch (default: its own choice).
    #[arg(long)]
    threads: Option<i32>,
    /// A directory of PEFT folders: a request for an unknown model named like one of them
    /// loads it first (vLLM's filesystem LoRA resolver), so a restart loses no adapter.
    #[arg(long)]
    lora_resolver_dir: Option<PathBuf>,
    /// A folder `/v1/load_lora_adapter` may load adapters from (repeatable; the resolver
    /// directory is one too). Paths outside, symlinks out included, are refused.
    #[arg(long = "lora-root")]
    lora_roots: Vec<PathBuf>,
    /// Adapters loaded at once; a load past it is refused until one is unloaded.
    #[arg(long, default_value_t = 64)]
    max_loaded_adapters: usize,
}

fn parse_adapter(arg: &str) -> Result<(String, PathBuf), String> {
    match arg.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(dir)))
        }
        _ => Err(format!("expected NAME=DIR, got {arg:?}")),
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(threads) = cli.threads {
        tch::set_num_threads(threads);
    }
    let options = ServeOptions {
        lora_resolver_dir: cli.lora_resolver_dir,
        lora_roots: cli.lora_roots,
        max_loaded_adapters: cli.max_loaded_adapters,
        model: cli.model,
        served_model_name: cli.served_model_name,
        adapters: cli.adapters,
        placement: cli.device,
        max_num_seqs: cli.max_num_seqs,
        addr: SocketAddr::new(cli.host, cli.port),
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async {
        let server = Server::start(options).await?;
        // Tests and scripts read the bound address (port 0 picks one) from this line.
        println!("clawback-serve: listening on http://{}", server.addr());
        tokio::signal::ctrl_c()
            .await
            .context("waiting for ctrl-c")?;
        server.stop();
        server.finished().await;
        anyhow::Ok(())
    })
}
