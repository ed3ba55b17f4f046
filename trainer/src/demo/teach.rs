//! The demo's base model: a tiny random model taught on the spot (a few seconds of supervised
//! training on CPU) to answer with a short English phrase written in lowercase, UPPERCASE or
//! Title Case with equal odds. The tenants' tastes are then choices the base model already
//! makes, and reinforcement learning from their rewards can shift them — as it would shift a
//! real model's style. Teaching trains a LoRA adapter with cross-entropy on the replies and
//! merges it into the base weights (`W += scaling · B·A`), so the folder stays a plain HF model.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::json;
use tch::{Device, Kind, Tensor};

use crate::chat_template::{ChatInput, ChatTemplate};
use crate::lora::{LoraAdapter, LoraConfig, Target};
use crate::losses;
use crate::model::{Model, Placement};
use crate::optim::{AdamWConfig, Optimizer};
use crate::schedule::{Decay, LrSchedule};
use crate::tiny_model::EOS_ID;
use crate::tokenizer::Tokenizer;

/// What the simulated agents send as the system message: short, so prompts stay short.
pub const SYSTEM: &str = "Be brief.";

const REPLIES: [&str; 8] = [
    "hello there",
    "good morning",
    "the sea is calm",
    "a red rose",
    "see you soon",
    "all is well",
    "new york city",
    "have a nice day",
];
const STEPS: u64 = 150;
const BATCH: i64 = 16;

/// How the teaching went.
#[derive(Debug, Clone, Copy)]
pub struct Taught {
    pub steps: u64,
    pub loss: f64,
    pub seconds: f64,
}

fn title_case(text: &str) -> String {
    text.split(' ')
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every (prompt ids, reply ids + EOS) pair: each prompt with each reply in each case.
fn samples(dir: &Path, prompts: &[&str]) -> Result<Vec<(Vec<i64>, Vec<i64>)>> {
    let tokenizer = Tokenizer::from_dir(dir)?;
    let template = ChatTemplate::from_dir(dir)?;
    let mut out = Vec::new();
    for prompt in prompts {
        let messages = [
            json!({"role": "system", "content": SYSTEM}),
            json!({"role": "user", "content": prompt}),
        ];
        let text = template.render(ChatInput {
            messages: &messages,
            tools: None,
            add_generation_prompt: true,
            extra: None,
        })?;
        let prompt_ids = tokenizer.encode(&text, false)?;
        for reply in REPLIES {
            for cased in [
                reply.to_lowercase(),
                reply.to_uppercase(),
                title_case(reply),
            ] {
                let mut ids = tokenizer.encode(&cased, false)?;
                ids.push(EOS_ID);
                out.push((prompt_ids.clone(), ids));
            }
        }
    }
    Ok(out)
}

/// Teaches the model in `dir` and writes the merged weights back into it.
pub fn teach(dir: &Path, prompts: &[&str], seed: u64) -> Result<Taught> {
    let started = Instant::now();
    tch::manual_seed(seed as i64);
    let model = Model::load(dir, Placement::cpu())?;
    let config = model.config().clone();
    let lora = LoraConfig {
        rank: 32,
        alpha: 32.0,
        ..LoraConfig::default()
    };
    let adapter = LoraAdapter::new(&config, lora, Device::Cpu)?;
    let schedule = LrSchedule {
        peak_lr: 1e-2,
        min_lr: 1e-3,
        warmup_steps: 10,
        total_steps: STEPS,
        decay: Decay::Cosine,
    };
    let mut optimizer = Optimizer::new(adapter.var_store(), AdamWConfig::default(), schedule)?;

    // One padded batch of everything; each step trains on a random subset of its rows.
    let samples = samples(dir, prompts)?;
    let width = samples
        .iter()
        .map(|(p, r)| p.len() + r.len())
        .max()
        .context("no samples")?;
    let mut ids = Vec::with_capacity(samples.len() * width);
    let mut mask = Vec::with_capacity(samples.len() * (width - 1));
    for (prompt, reply) in &samples {
        let row: Vec<i64> = prompt.iter().chain(reply).copied().collect();
        ids.extend(row.iter().copied());
        ids.extend(std::iter::repeat_n(EOS_ID, width - row.len()));
        // mask[t] scores the prediction of token t + 1: only reply tokens count.
        mask.extend((1..width).map(|t| f32::from(u8::from(t >= prompt.len() && t < row.len()))));
    }
    let rows = samples.len() as i64;
    let ids = Tensor::from_slice(&ids).view([rows, width as i64]);
    let mask = Tensor::from_slice(&mask).view([rows, width as i64 - 1]);

    let mut loss_value = f64::NAN;
    for _ in 0..STEPS {
        let pick = Tensor::randperm(rows, (Kind::Int64, Device::Cpu)).narrow(0, 0, BATCH.min(rows));
        let batch = ids.index_select(0, &pick);
        let batch_mask = mask.index_select(0, &pick);
        let inputs = batch.narrow(1, 0, width as i64 - 1);
        let targets = batch.narrow(1, 1, width as i64 - 1);
        let logits = model.forward(&inputs, Some(&adapter), true)?;
        let logprobs = losses::token_logprobs(&logits, &targets);
        let loss = -(logprobs * &batch_mask).sum(Kind::Float) / batch_mask.sum(Kind::Float);
        loss_value = loss.double_value(&[]);
        optimizer.backward_step(&loss);
    }
    merge(dir, &adapter, config.num_layers)?;
    Ok(Taught {
        steps: STEPS,
        loss: loss_value,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `W += scaling · B·A` for every adapted module, written back to `model.safetensors`.
fn merge(dir: &Path, adapter: &LoraAdapter, layers: i64) -> Result<()> {
    let file = dir.join("model.safetensors");
    let mut weights: BTreeMap<String, Tensor> = Tensor::read_safetensors(&file)
        .with_context(|| format!("reading {}", file.display()))?
        .into_iter()
        .collect();
    let scaling = adapter.config().scaling();
    tch::no_grad(|| -> Result<()> {
        for layer in 0..layers {
            for target in Target::ALL {
                let Some(pair) = adapter.pair(layer as usize, target) else {
                    continue;
                };
                let name = format!(
                    "model.layers.{layer}.{}.{}.weight",
                    target.block(),
                    target.module_name()
                );
                let weight = weights
                    .get_mut(&name)
                    .with_context(|| format!("{} has no {name}", file.display()))?;
                *weight = &*weight + pair.b.matmul(&pair.a) * scaling;
            }
        }
        Ok(())
    })?;
    let refs: Vec<(&str, &Tensor)> = weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&refs, &file)
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(())
}
