//! `clawback-trainer`: the trainer's command line. `train` trains per-tenant adapters from the
//! datapool; `generate` runs a model (and optionally a PEFT adapter) on one chat message;
//! `bench` measures training throughput; `tiny-model` writes a tiny random model. The reference
//! engine is its own binary, `clawback-serve`; the demo that runs all of clawback end to end is
//! `clawback-demo`.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use clawback_model::chat_template::{ChatInput, ChatTemplate};
use clawback_model::generate::{generate, SamplingParams};
use clawback_model::lora::{LoraAdapter, LoraConfig};
use clawback_model::model::{Model, Placement};
use clawback_model::tokenizer::Tokenizer;
use clawback_trainer::bench::{self, BenchSpec, Preset};
use clawback_trainer::train::{self, RunOptions, TrainConfig};

#[derive(Parser)]
#[command(
    version,
    about = "clawback's trainer: Llama/Qwen decoder, LoRA, RL losses"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum PresetArg {
    Tiny,
    #[value(name = "100m")]
    M100,
}

#[derive(Subcommand)]
enum Command {
    /// Trains each tenant's LoRA adapter from the datapool's ready queue (see trainer.example.toml).
    Train {
        #[arg(long)]
        config: PathBuf,
        /// Train on what is ready now, checkpoint, ack, and exit (instead of polling for more).
        #[arg(long)]
        exit_when_idle: bool,
    },
    /// Writes a tiny random Qwen2-shaped model in HF format (config, safetensors, byte-level
    /// tokenizer, Qwen2.5 chat template): what tests serve with vLLM or `serve`, where no weights
    /// can be downloaded.
    TinyModel {
        /// The folder to write (created if missing).
        dir: PathBuf,
        #[arg(long, default_value_t = 2)]
        layers: i64,
        /// vLLM's CPU attention wants a head size of at least 32: hidden / heads.
        #[arg(long, default_value_t = 64)]
        hidden: i64,
        #[arg(long, default_value_t = 128)]
        intermediate: i64,
        #[arg(long, default_value_t = 2)]
        heads: i64,
        #[arg(long, default_value_t = 1)]
        kv_heads: i64,
        #[arg(long, default_value_t = 0)]
        seed: i64,
    },
    /// Training tokens/s (forward + loss + backward + AdamW on LoRA params) on a random model,
    /// or on a real one with --model.
    Bench {
        #[arg(long, value_enum, default_value = "tiny")]
        preset: PresetArg,
        /// A real model's HF folder instead of a preset's random weights (batch 1 × 256 tokens,
        /// 3 steps unless given).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Also the frozen base's no-grad pass per step (hint distillation's teacher).
        #[arg(long)]
        teacher: bool,
        /// auto, cpu, cuda or cuda:N (CPU runs f32, CUDA bf16).
        #[arg(long, default_value = "auto")]
        device: Placement,
        #[arg(long)]
        batch: Option<i64>,
        #[arg(long)]
        seq_len: Option<i64>,
        #[arg(long)]
        steps: Option<usize>,
        #[arg(long, default_value_t = 1)]
        warmup_steps: usize,
        #[arg(long, default_value_t = 16)]
        rank: i64,
        /// The device's dense peak in TFLOP/s, to print MFU (H100/H200 bf16: 989).
        #[arg(long)]
        peak_tflops: Option<f64>,
        /// CPU threads for libtorch (default: its own choice, usually the core count).
        #[arg(long)]
        threads: Option<i32>,
        /// Print one JSON object instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Renders one user message with the model's chat template and generates a reply.
    Generate {
        /// An HF folder: config.json, safetensors, tokenizer.json, tokenizer_config.json.
        #[arg(long)]
        model: PathBuf,
        /// A PEFT adapter folder to apply.
        #[arg(long)]
        adapter: Option<PathBuf>,
        #[arg(long)]
        system: Option<String>,
        #[arg(long)]
        prompt: String,
        #[arg(long, default_value_t = 128)]
        max_new_tokens: usize,
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        #[arg(long, default_value_t = 1.0)]
        top_p: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value = "auto")]
        device: Placement,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Train {
            config,
            exit_when_idle,
        } => {
            let config = TrainConfig::load(&config)?;
            let options = RunOptions {
                exit_when_idle,
                handle_signals: true,
            };
            let summary = train::run(&config, options, Arc::new(AtomicBool::new(false)))?;
            for (tenant, steps) in &summary.optimizer_steps {
                eprintln!("clawback-trainer: {tenant}: {steps} optimizer steps this run");
            }
        }
        Command::TinyModel {
            dir,
            layers,
            hidden,
            intermediate,
            heads,
            kv_heads,
            seed,
        } => {
            let model = clawback_model::tiny_model::TinyModel {
                layers,
                hidden,
                intermediate,
                heads,
                kv_heads,
                seed,
                ..clawback_model::tiny_model::TinyModel::default()
            };
            model.write(&dir)?;
            println!("{}", dir.display());
        }
        Command::Bench {
            preset,
            model,
            teacher,
            device,
            batch,
            seq_len,
            steps,
            warmup_steps,
            rank,
            peak_tflops,
            threads,
            json,
        } => {
            if let Some(threads) = threads {
                tch::set_num_threads(threads);
            }
            let (preset, mut name, defaults) = match (preset, &model) {
                (_, Some(dir)) => (Preset::M100, dir.display().to_string(), (1, 256, 3)),
                (PresetArg::Tiny, None) => (Preset::Tiny, "tiny".to_owned(), (8, 64, 20)),
                (PresetArg::M100, None) => (Preset::M100, "100m".to_owned(), (1, 256, 3)),
            };
            if teacher {
                name.push_str(" + teacher pass");
            }
            let spec = BenchSpec {
                model: preset.config(),
                weights: model,
                teacher,
                placement: device,
                lora: LoraConfig {
                    rank,
                    alpha: 2.0 * rank as f64,
                    ..LoraConfig::default()
                },
                batch: batch.unwrap_or(defaults.0),
                seq_len: seq_len.unwrap_or(defaults.1),
                warmup_steps,
                steps: steps.unwrap_or(defaults.2),
            };
            if spec.seq_len < 2 || spec.batch < 1 || spec.steps < 1 {
                bail!("need --seq-len ≥ 2, --batch ≥ 1 and --steps ≥ 1");
            }
            let report = bench::run(&spec)?;
            let mfu = peak_tflops.map(|p| report.mfu(p));
            let device = format!("{:?}/{:?}", spec.placement.device, spec.placement.kind);
            if json {
                let value = serde_json::json!({
                    "preset": name, "device": device, "threads": tch::get_num_threads(),
                    "batch": spec.batch, "seq_len": spec.seq_len, "lora_rank": rank,
                    "base_parameters": report.base_parameters,
                    "lora_parameters": report.lora_parameters,
                    "seconds_per_step": report.seconds_per_step,
                    "tokens_per_second": report.tokens_per_second,
                    "model_tflops": report.model_tflops, "mfu": mfu,
                });
                println!("{value}");
            } else {
                print!(
                    "{name} ({:.1}M params, LoRA r{rank} {:.2}M) on {device}, {} threads, \
                     batch {}×{}: {:.0} tokens/s, {:.3} s/step, {:.3} model TFLOP/s",
                    report.base_parameters as f64 / 1e6,
                    report.lora_parameters as f64 / 1e6,
                    tch::get_num_threads(),
                    spec.batch,
                    spec.seq_len,
                    report.tokens_per_second,
                    report.seconds_per_step,
                    report.model_tflops,
                );
                match mfu {
                    Some(mfu) => println!(", MFU {:.1}%", 100.0 * mfu),
                    None => println!(),
                }
            }
        }
        Command::Generate {
            model,
            adapter,
            system,
            prompt,
            max_new_tokens,
            temperature,
            top_p,
            seed,
            device,
        } => {
            let net = Model::load(&model, device)
                .with_context(|| format!("loading {}", model.display()))?;
            let tokenizer = Tokenizer::from_dir(&model)?;
            let template = ChatTemplate::from_dir(&model)?;
            let adapter = match adapter {
                Some(dir) => Some(
                    LoraAdapter::load(&dir, net.config(), device.device)
                        .with_context(|| format!("loading adapter {}", dir.display()))?,
                ),
                None => None,
            };
            let mut messages = Vec::new();
            if let Some(system) = system {
                messages.push(serde_json::json!({"role": "system", "content": system}));
            }
            messages.push(serde_json::json!({"role": "user", "content": prompt}));
            let text = template.render(ChatInput {
                messages: &messages,
                tools: None,
                add_generation_prompt: true,
                extra: None,
            })?;
            let ids = tokenizer.encode(&text, false)?;
            let mut stop_token_ids = net.config().eos_token_ids.clone();
            if let Some(eos) = &template.special_tokens().eos_token {
                stop_token_ids.extend(tokenizer.token_id(eos));
            }
            let params = SamplingParams {
                max_new_tokens,
                temperature,
                top_p,
                seed,
                stop_token_ids,
            };
            let out = generate(&net, adapter.as_ref(), &ids, &params)?;
            println!("{}", tokenizer.decode(&out.token_ids, true)?);
        }
    }
    Ok(())
}
