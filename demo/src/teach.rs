//! The demo's base model: a tiny random model taught on the spot (seconds of supervised training
//! on CPU) to answer with a short English phrase written in lowercase, UPPERCASE or Title Case
//! with equal odds — and, for the feedback scenario, in the case a request in the last user
//! message asks for ([`crate::feedback::lessons`]). The tenants' tastes are then choices the
//! base model already makes, and learning from their signals can shift them — as it would shift
//! a real model's style. Teaching trains a LoRA adapter with cross-entropy on the replies and
//! merges it into the base weights (`W += scaling · B·A`), so the folder stays a plain HF model.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use clawback_model::chat_template::{ChatInput, ChatTemplate};
use clawback_model::lora::{LoraAdapter, LoraConfig, Target};
use clawback_model::model::{Model, Placement};
use clawback_model::tiny_model::EOS_ID;
use clawback_model::tokenizer::Tokenizer;
use clawback_trainer::losses;
use clawback_trainer::optim::{AdamWConfig, Optimizer};
use clawback_trainer::schedule::{Decay, LrSchedule};

use crate::style::Case;

/// What the simulated agents send as the system message: short, so prompts stay short.
pub const SYSTEM: &str = "Be brief.";

/// What the model answers, in one case or another.
pub const REPLIES: [&str; 8] = [
    "hello there",
    "good morning",
    "the sea is calm",
    "a red rose",
    "see you soon",
    "all is well",
    "new york city",
    "have a nice day",
];
const BATCH: i64 = 16;

/// One conversation to teach and the replies to learn for it: several replies to one
/// conversation teach the model to choose among them at equal odds.
#[derive(Debug, Clone)]
pub struct Lesson {
    pub messages: Vec<Value>,
    pub replies: Vec<String>,
    /// The case the last user message asks for, if any (every reply is in it).
    pub asked: Option<Case>,
}

/// The group scenario's lessons: each prompt answered with each phrase in each case.
pub fn cases(prompts: &[&str]) -> Vec<Lesson> {
    prompts
        .iter()
        .flat_map(|prompt| {
            REPLIES.iter().map(move |reply| Lesson {
                messages: vec![
                    json!({"role": "system", "content": SYSTEM}),
                    json!({"role": "user", "content": prompt}),
                ],
                replies: Case::ALL.iter().map(|case| case.apply(reply)).collect(),
                asked: None,
            })
        })
        .collect()
}

/// How the teaching went.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Taught {
    pub steps: u64,
    pub loss: f64,
    pub seconds: f64,
    /// How the taught model splits its answers between the cases, on lessons it never saw.
    pub mass: CaseMass,
}

/// The probability the model puts on each case's replies (every phrase it knows, in that
/// case), averaged over conversations.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CaseMass {
    /// On conversations whose last user message asks for a case: the mass on that case.
    pub asked: Option<f64>,
    /// On conversations that ask for nothing: lower, UPPER, Title.
    pub free: [f64; 3],
}

/// The ids of `lesson`'s conversation rendered for the assistant's next reply.
fn prompt_of(template: &ChatTemplate, tokenizer: &Tokenizer, lesson: &Lesson) -> Result<Vec<i64>> {
    let text = template.render(ChatInput {
        messages: &lesson.messages,
        tools: None,
        add_generation_prompt: true,
        extra: None,
    })?;
    Ok(tokenizer.encode(&text, false)?)
}

/// Every (prompt ids, reply ids + EOS) pair of `lessons`.
fn samples(dir: &Path, lessons: &[Lesson]) -> Result<Vec<(Vec<i64>, Vec<i64>)>> {
    let tokenizer = Tokenizer::from_dir(dir)?;
    let template = ChatTemplate::from_dir(dir)?;
    let mut out = Vec::new();
    for lesson in lessons {
        let prompt_ids = prompt_of(&template, &tokenizer, lesson)?;
        for reply in &lesson.replies {
            let mut ids = tokenizer.encode(reply, false)?;
            ids.push(EOS_ID);
            out.push((prompt_ids.clone(), ids));
        }
    }
    Ok(out)
}

/// A stage of teaching: lessons, and the optimizer steps they get.
#[derive(Debug, Clone)]
pub struct Stage {
    pub lessons: Vec<Lesson>,
    pub steps: u64,
}

/// Teaches the model in `dir` its `stages` one after the other (each a LoRA adapter merged
/// into the weights before the next), then measures it on `held_out` lessons.
pub fn teach(dir: &Path, stages: &[Stage], held_out: &[Lesson], seed: u64) -> Result<Taught> {
    let started = Instant::now();
    tch::manual_seed(seed as i64);
    // Nothing else runs yet: teaching may use every core (the demo runs on one otherwise).
    let threads = tch::get_num_threads();
    tch::set_num_threads(std::thread::available_parallelism().map_or(1, |n| n.get() as i32));
    let taught = (|| {
        let mut loss = f64::NAN;
        for stage in stages {
            loss = teach_stage(dir, &stage.lessons, stage.steps)?;
        }
        let model = Model::load(dir, Placement::cpu())?;
        Ok::<_, anyhow::Error>(Taught {
            steps: stages.iter().map(|s| s.steps).sum(),
            loss,
            seconds: 0.0,
            mass: case_mass(dir, &model, held_out)?,
        })
    })();
    tch::set_num_threads(threads);
    let mut taught = taught?;
    taught.seconds = started.elapsed().as_secs_f64();
    Ok(taught)
}

/// Trains one adapter on `lessons` for `steps` and merges it; the loss at the end.
fn teach_stage(dir: &Path, lessons: &[Lesson], steps: u64) -> Result<f64> {
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
        total_steps: steps,
        decay: Decay::Cosine,
    };
    let mut optimizer = Optimizer::new(adapter.var_store(), AdamWConfig::default(), schedule)?;

    // One padded batch of everything; each step trains on a random subset of its rows, cut to
    // the longest of them.
    let samples = samples(dir, lessons)?;
    let lengths: Vec<i64> = samples
        .iter()
        .map(|(p, r)| (p.len() + r.len()) as i64)
        .collect();
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

    // The loss reported: the mean over the last steps (one batch's is noisy).
    let mut last_losses = std::collections::VecDeque::new();
    for _ in 0..steps {
        let pick = Tensor::randperm(rows, (Kind::Int64, Device::Cpu)).narrow(0, 0, BATCH.min(rows));
        let picked: Vec<i64> = Vec::try_from(&pick)?;
        let used = picked
            .iter()
            .filter_map(|&row| lengths.get(row as usize))
            .max()
            .copied()
            .unwrap_or(width as i64);
        let batch = ids.index_select(0, &pick);
        let batch_mask = mask.index_select(0, &pick).narrow(1, 0, used - 1);
        let inputs = batch.narrow(1, 0, used - 1);
        let targets = batch.narrow(1, 1, used - 1);
        let logits = model.forward(&inputs, Some(&adapter), true)?;
        let logprobs = losses::token_logprobs(&logits, &targets);
        let loss = -(logprobs * &batch_mask).sum(Kind::Float) / batch_mask.sum(Kind::Float);
        last_losses.push_back(loss.double_value(&[]));
        if last_losses.len() > 20 {
            last_losses.pop_front();
        }
        optimizer.backward_step(&loss);
    }
    merge(dir, &adapter, config.num_layers)?;
    Ok(crate::report::mean(last_losses.into_iter()).unwrap_or(f64::NAN))
}

/// [`CaseMass`] of `model` on `lessons`.
fn case_mass(dir: &Path, model: &Model, lessons: &[Lesson]) -> Result<CaseMass> {
    let _no_grad = tch::no_grad_guard();
    let tokenizer = Tokenizer::from_dir(dir)?;
    let template = ChatTemplate::from_dir(dir)?;
    let (mut asked, mut asked_n) = (0.0, 0usize);
    let (mut free, mut free_n) = ([0.0; 3], 0usize);
    for lesson in lessons {
        let prompt = prompt_of(&template, &tokenizer, lesson)?;
        // Every phrase in every case: its log-likelihood after the prompt.
        let mut rows = Vec::new();
        for case in Case::ALL {
            for phrase in REPLIES {
                let mut reply = tokenizer.encode(&case.apply(phrase), false)?;
                reply.push(EOS_ID);
                rows.push(reply);
            }
        }
        let width = prompt.len() + rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows.len() * width);
        let mut mask = Vec::with_capacity(rows.len() * (width - 1));
        for reply in &rows {
            let row: Vec<i64> = prompt.iter().chain(reply).copied().collect();
            ids.extend(row.iter().copied());
            ids.extend(std::iter::repeat_n(EOS_ID, width - row.len()));
            mask.extend(
                (1..width).map(|t| f32::from(u8::from(t >= prompt.len() && t < row.len()))),
            );
        }
        let n = rows.len() as i64;
        let ids = Tensor::from_slice(&ids).view([n, width as i64]);
        let mask = Tensor::from_slice(&mask).view([n, width as i64 - 1]);
        let logits = model.forward(&ids.narrow(1, 0, width as i64 - 1), None, false)?;
        let logprobs = losses::token_logprobs(&logits, &ids.narrow(1, 1, width as i64 - 1));
        let per_row = (logprobs * &mask).sum_dim_intlist(1, false, Kind::Float);
        let likelihood: Vec<f64> = Vec::try_from(&per_row.exp().to_kind(Kind::Double))?;
        let total: f64 = likelihood.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let per_case: Vec<f64> = likelihood
            .chunks(REPLIES.len())
            .map(|c| c.iter().sum::<f64>() / total)
            .collect();
        match lesson
            .asked
            .and_then(|c| Case::ALL.iter().position(|&a| a == c))
        {
            Some(index) => {
                asked += per_case[index];
                asked_n += 1;
            }
            None => {
                for (sum, mass) in free.iter_mut().zip(&per_case) {
                    *sum += mass;
                }
                free_n += 1;
            }
        }
    }
    Ok(CaseMass {
        asked: (asked_n > 0).then(|| asked / asked_n as f64),
        free: free.map(|sum| sum / free_n.max(1) as f64),
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
