//! Training throughput: tokens per second of full LoRA training steps (forward with the
//! adapter, the clipped-surrogate loss, backward, clipping, AdamW) on a random model of a
//! preset size, so the figure is comparable across machines and commits — or on a real model's
//! weights, optionally with the frozen base's no-grad pass that hint distillation's teacher adds
//! to every step.

use std::path::PathBuf;
use std::time::Instant;

use tch::{Kind, Tensor};

use crate::losses::{self, LossConfig, PolicyBatch};
use crate::optim::{AdamWConfig, Optimizer};
use crate::schedule::{Decay, LrSchedule};
use clawback_model::config::ModelConfig;
use clawback_model::lora::{LoraAdapter, LoraConfig, LoraError};
use clawback_model::model::{Model, ModelError, Placement};

/// What went wrong running the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Lora(#[from] LoraError),
    #[error(transparent)]
    Loss(#[from] losses::LossError),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// A model size to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// The parity tests' size: measures overhead more than arithmetic.
    Tiny,
    /// About 100M parameters, Qwen2-shaped (12 layers, hidden 768, GQA 12/4, vocab 32k).
    M100,
}

impl Preset {
    pub fn config(self) -> ModelConfig {
        let json = match self {
            Preset::Tiny => {
                r#"{"model_type": "qwen2", "vocab_size": 300, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "tie_word_embeddings": true}"#
            }
            Preset::M100 => {
                r#"{"model_type": "qwen2", "vocab_size": 32000, "hidden_size": 768,
                "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
                "num_key_value_heads": 4, "tie_word_embeddings": true, "rope_theta": 1000000.0}"#
            }
        };
        // The presets are constants: a parse failure is a bug in this file.
        ModelConfig::from_json(json).unwrap_or_else(|e| panic!("preset config: {e}"))
    }
}

/// One benchmark run's shape.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// The shape of the random model, unless `weights` gives a real one.
    pub model: ModelConfig,
    /// A real model's HF folder, loaded instead of random weights of `model`'s shape.
    pub weights: Option<PathBuf>,
    /// Adds the frozen base's forward pass (no gradient, no adapter) per step: the teacher of
    /// hint distillation, which scores every hinted token.
    pub teacher: bool,
    pub placement: Placement,
    pub lora: LoraConfig,
    pub batch: i64,
    pub seq_len: i64,
    /// Untimed steps first (allocator and kernel warmup).
    pub warmup_steps: usize,
    pub steps: usize,
}

/// The measured figures.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    pub base_parameters: i64,
    pub lora_parameters: i64,
    pub tokens_per_step: i64,
    pub seconds_per_step: f64,
    pub tokens_per_second: f64,
    /// Estimated arithmetic per second: 4 · N_base (forward + input gradients through the
    /// frozen matmuls, lm_head included, embeddings excluded) + 6 · N_lora per token.
    pub model_tflops: f64,
}

impl BenchReport {
    /// Model FLOPs utilisation against a device's peak, in [0, 1].
    pub fn mfu(&self, peak_tflops: f64) -> f64 {
        self.model_tflops / peak_tflops
    }
}

/// Runs `spec.warmup_steps + spec.steps` training steps and times the latter.
pub fn run(spec: &BenchSpec) -> Result<BenchReport, BenchError> {
    tch::manual_seed(0);
    let model = match &spec.weights {
        Some(dir) => Model::load(dir, spec.placement)?,
        None => Model::random(spec.model.clone(), spec.placement)?,
    };
    let config = model.config().clone();
    let adapter = LoraAdapter::new(&config, spec.lora.clone(), spec.placement.device)?;
    let schedule = LrSchedule {
        peak_lr: 1e-4,
        min_lr: 1e-5,
        warmup_steps: 1,
        total_steps: (spec.warmup_steps + spec.steps) as u64,
        decay: Decay::Cosine,
    };
    let mut optimizer = Optimizer::new(adapter.var_store(), AdamWConfig::default(), schedule)?;
    let device = spec.placement.device;
    let ids = Tensor::randint(
        config.vocab_size,
        [spec.batch, spec.seq_len],
        (Kind::Int64, device),
    );
    let inputs = ids.narrow(1, 0, spec.seq_len - 1);
    let targets = ids.narrow(1, 1, spec.seq_len - 1);
    let shape = [spec.batch, spec.seq_len - 1];
    let advantages = Tensor::randn(shape, (Kind::Float, device));
    let mask = Tensor::ones(shape, (Kind::Float, device));

    let mut timed = 0.0;
    for step in 0..spec.warmup_steps + spec.steps {
        let start = Instant::now();
        let logits = model.forward(&inputs, Some(&adapter), true)?;
        let behaviour = tch::no_grad(|| losses::token_logprobs(&logits, &targets));
        let batch = PolicyBatch {
            logits: &logits,
            tokens: &targets,
            behaviour_logprobs: &behaviour,
            advantages: &advantages,
            mask: &mask,
            reference_logprobs: None,
        };
        let (loss, _) = losses::policy_loss(&batch, &LossConfig::default())?;
        optimizer.backward_step(&loss);
        if spec.teacher {
            let teacher = tch::no_grad(|| model.forward(&inputs, None, false))?;
            let _ = tch::no_grad(|| losses::token_logprobs(&teacher, &targets));
        }
        // Kernels run asynchronously: wait for them before reading the clock.
        if let tch::Device::Cuda(ordinal) = device {
            tch::Cuda::synchronize(ordinal as i64);
        }
        if step >= spec.warmup_steps {
            timed += start.elapsed().as_secs_f64();
        }
    }

    let base_parameters = model.num_parameters();
    let lora_parameters: i64 = adapter
        .var_store()
        .trainable_variables()
        .iter()
        .map(|t| t.numel() as i64)
        .sum();
    // The embedding lookup costs no matmul; the head does, tied or not.
    let c = &config;
    let embedding_lookup = if c.tie_word_embeddings {
        0
    } else {
        c.vocab_size * c.hidden_size
    };
    let matmul_parameters = base_parameters - embedding_lookup;
    let tokens_per_step = spec.batch * (spec.seq_len - 1);
    let seconds_per_step = timed / spec.steps.max(1) as f64;
    let tokens_per_second = tokens_per_step as f64 / seconds_per_step;
    // The teacher's pass is a forward of the frozen matmuls: 2 · N_base more.
    let teacher_flops = if spec.teacher { 2.0 } else { 0.0 };
    let flops_per_token =
        (4.0 + teacher_flops) * matmul_parameters as f64 + 6.0 * lora_parameters as f64;
    Ok(BenchReport {
        base_parameters,
        lora_parameters,
        tokens_per_step,
        seconds_per_step,
        tokens_per_second,
        model_tflops: flops_per_token * tokens_per_second / 1e12,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_100m_preset_has_about_100m_parameters() {
        let total = clawback_model::model::parameter_count(&Preset::M100.config());
        assert!((90_000_000..130_000_000).contains(&total), "{total}");
    }

    #[test]
    fn a_tiny_benchmark_reports_positive_throughput() {
        let spec = BenchSpec {
            model: Preset::Tiny.config(),
            weights: None,
            teacher: true,
            placement: Placement::cpu(),
            lora: LoraConfig::default(),
            batch: 2,
            seq_len: 16,
            warmup_steps: 1,
            steps: 2,
        };
        let report = run(&spec).unwrap();
        assert_eq!(report.tokens_per_step, 30);
        assert!(report.tokens_per_second > 0.0);
        // rank 16 on all 7 projections of 2 layers.
        let c = &spec.model;
        let per_layer: i64 = clawback_model::lora::Target::ALL
            .iter()
            .map(|t| {
                let (i, o) = t.dims(c);
                16 * (i + o)
            })
            .sum();
        assert_eq!(report.lora_parameters, 2 * per_layer);
    }
}
