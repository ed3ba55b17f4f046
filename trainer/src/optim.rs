//! One optimizer step over an adapter's parameters: AdamW, the global gradient norm clipped
//! to a maximum, and the learning rate taken from the schedule.
//!
//! AdamW is written out here rather than taken from libtorch's `torch::optim` (which tch wraps
//! without a way to read its moment buffers): a training run must survive a restart, so the
//! moments are saved with each checkpoint and restored on resume. The update is torch's
//! `AdamW` (decoupled weight decay, bias-corrected moments, `eps` outside the square root).

use std::path::Path;

use tch::{nn, Kind, Tensor};

use crate::schedule::LrSchedule;

/// AdamW's settings besides the learning rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// The global L2 norm gradients are scaled down to; 0 turns clipping off.
    pub max_grad_norm: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
        }
    }
}

/// What went wrong saving or restoring the optimizer's state.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    #[error("cannot write optimizer state to {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("cannot read optimizer state from {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: tch::TchError,
    },
    #[error("optimizer state {path} has no {name} of shape {want:?} (found {got:?})")]
    Mismatch {
        path: String,
        name: String,
        want: Vec<i64>,
        got: Option<Vec<i64>>,
    },
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    pub step: u64,
    pub lr: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
}

/// One trainable variable and its two moments.
struct Slot {
    name: String,
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// AdamW over the variables of one `VarStore` (an adapter's), with clipping and a schedule.
pub struct Optimizer {
    /// Sorted by variable name, so saved state lines up with the variables by name.
    slots: Vec<Slot>,
    config: AdamWConfig,
    schedule: LrSchedule,
    step: u64,
    /// The step the moments started from (0, or where [`Optimizer::restart`] zeroed them): the
    /// bias corrections count from here.
    moments_from: u64,
}

impl std::fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Optimizer")
            .field("schedule", &self.schedule)
            .field("step", &self.step)
            .finish()
    }
}

impl Optimizer {
    pub fn new(
        vars: &nn::VarStore,
        config: AdamWConfig,
        schedule: LrSchedule,
    ) -> Result<Self, tch::TchError> {
        let mut named: Vec<(String, Tensor)> = vars
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let slots = named
            .into_iter()
            .map(|(name, param)| {
                Ok(Slot {
                    exp_avg: param.f_zeros_like()?,
                    exp_avg_sq: param.f_zeros_like()?,
                    name,
                    param,
                })
            })
            .collect::<Result<Vec<_>, tch::TchError>>()?;
        Ok(Optimizer {
            slots,
            config,
            schedule,
            step: 0,
            moments_from: 0,
        })
    }

    /// Zeroes the moments and goes on at `step` of the schedule: the moments start again (their
    /// bias corrections as on a first step), the learning rate does not warm up again. For
    /// weights that are not the ones the moments were gathered on (a rollback to an earlier
    /// version).
    pub fn restart(&mut self, step: u64) {
        tch::no_grad(|| {
            for slot in &mut self.slots {
                let _ = slot.exp_avg.zero_();
                let _ = slot.exp_avg_sq.zero_();
            }
        });
        self.step = step;
        self.moments_from = step;
    }

    /// The step the moments started from (what a checkpoint keeps beside the step count).
    pub fn moments_from(&self) -> u64 {
        self.moments_from
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The learning rate the next step will use.
    pub fn next_lr(&self) -> f64 {
        self.schedule.lr(self.step)
    }

    /// Backpropagates `loss`, clips, and applies one update. Several micro-batches can be
    /// accumulated by calling [`Optimizer::accumulate`] first and then this with the last.
    pub fn backward_step(&mut self, loss: &Tensor) -> StepStats {
        loss.backward();
        self.apply()
    }

    /// Adds `loss`'s gradients without updating (gradient accumulation).
    pub fn accumulate(&mut self, loss: &Tensor) {
        loss.backward();
    }

    /// Clips and applies one update from the gradients accumulated so far, then clears them.
    pub fn apply(&mut self) -> StepStats {
        let grad_norm = self.clip_gradients();
        let lr = self.schedule.lr(self.step);
        let c = self.config;
        let t = (self.step - self.moments_from + 1) as i32;
        let correction1 = 1.0 - c.beta1.powi(t);
        let correction2 = 1.0 - c.beta2.powi(t);
        tch::no_grad(|| {
            for slot in &mut self.slots {
                let mut grad = slot.param.grad();
                if !grad.defined() {
                    continue;
                }
                let m = &slot.exp_avg * c.beta1 + &grad * (1.0 - c.beta1);
                let v = &slot.exp_avg_sq * c.beta2 + grad.square() * (1.0 - c.beta2);
                slot.exp_avg.copy_(&m);
                slot.exp_avg_sq.copy_(&v);
                let denom = v.sqrt() / correction2.sqrt() + c.eps;
                let update = m / denom * (lr / correction1);
                let decayed = &slot.param * (1.0 - lr * c.weight_decay) - update;
                slot.param.copy_(&decayed);
                let _ = grad.zero_();
            }
        });
        let stats = StepStats {
            step: self.step,
            lr,
            grad_norm,
        };
        self.step += 1;
        stats
    }

    /// Forgets accumulated gradients without stepping (a batch abandoned half-way).
    pub fn zero_grad(&mut self) {
        for slot in &self.slots {
            let mut grad = slot.param.grad();
            if grad.defined() {
                let _ = grad.zero_();
            }
        }
    }

    /// Writes the moments to `path` (safetensors, `exp_avg.<var>` and `exp_avg_sq.<var>`);
    /// the step count is the caller's to keep (it is in the checkpoint's state).
    pub fn save_state(&self, path: &Path) -> Result<(), OptimError> {
        let named: Vec<(String, &Tensor)> = self
            .slots
            .iter()
            .flat_map(|s| {
                [
                    (format!("exp_avg.{}", s.name), &s.exp_avg),
                    (format!("exp_avg_sq.{}", s.name), &s.exp_avg_sq),
                ]
            })
            .collect();
        clawback_model::safetensors_io::write(&named, path).map_err(|source| OptimError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    /// Restores the moments [`Optimizer::save_state`] wrote, the number of steps taken and the
    /// step the moments started from, so the schedule and the bias corrections continue where
    /// they stopped.
    pub fn load_state(
        &mut self,
        path: &Path,
        steps: u64,
        moments_from: u64,
    ) -> Result<(), OptimError> {
        let shown = path.display().to_string();
        let tensors: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(path)
            .map_err(|source| OptimError::Read {
                path: shown.clone(),
                source,
            })?
            .into_iter()
            .collect();
        tch::no_grad(|| {
            for slot in &mut self.slots {
                for (prefix, target) in [
                    ("exp_avg", &mut slot.exp_avg),
                    ("exp_avg_sq", &mut slot.exp_avg_sq),
                ] {
                    let name = format!("{prefix}.{}", slot.name);
                    let found = tensors.get(&name);
                    match found {
                        Some(t) if t.size() == target.size() => {
                            target.copy_(&t.to_kind(target.kind()).to_device(target.device()))
                        }
                        _ => {
                            return Err(OptimError::Mismatch {
                                path: shown.clone(),
                                name,
                                want: target.size(),
                                got: found.map(Tensor::size),
                            })
                        }
                    }
                }
            }
            Ok(())
        })?;
        self.step = steps;
        self.moments_from = moments_from.min(steps);
        Ok(())
    }

    /// Scales every gradient by `max / norm` when the global norm exceeds `max`.
    fn clip_gradients(&self) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self
                .slots
                .iter()
                .map(|s| s.param.grad())
                .filter(|g| g.defined())
                .collect();
            let squares: f64 = grads
                .iter()
                .map(|g| g.square().sum(Kind::Float).double_value(&[]))
                .sum();
            let norm = squares.sqrt();
            let max = self.config.max_grad_norm;
            if max > 0.0 && norm > max {
                let scale = max / (norm + 1e-6);
                for mut g in grads {
                    let _ = g.g_mul_scalar_(scale);
                }
            }
            norm
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Decay;
    use tch::Device;

    fn schedule() -> LrSchedule {
        LrSchedule {
            peak_lr: 0.1,
            min_lr: 0.0,
            warmup_steps: 1,
            total_steps: 10,
            decay: Decay::Constant,
        }
    }

    #[test]
    fn gradients_above_the_maximum_norm_are_scaled_down_to_it() {
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().var_copy("w", &Tensor::from_slice(&[0.0f32, 0.0]));
        let config = AdamWConfig {
            max_grad_norm: 1.0,
            ..AdamWConfig::default()
        };
        let opt = Optimizer::new(&vs, config, schedule()).unwrap();
        // d/dw of 3·w0 + 4·w1 is (3, 4): norm 5.
        let loss = (&w * Tensor::from_slice(&[3.0f32, 4.0])).sum(Kind::Float);
        loss.backward();
        let norm = opt.clip_gradients();
        assert!((norm - 5.0).abs() < 1e-6);
        let g = Vec::<f32>::try_from(&w.grad()).unwrap();
        assert!(
            (g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5,
            "{g:?}"
        );
    }

    #[test]
    fn adamw_walks_a_quadratic_to_its_minimum() {
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs
            .root()
            .var_copy("w", &Tensor::from_slice(&[2.0f32, -3.0]));
        let mut opt = Optimizer::new(&vs, AdamWConfig::default(), schedule()).unwrap();
        for _ in 0..200 {
            let loss = w.square().sum(Kind::Float);
            let stats = opt.backward_step(&loss);
            assert!(stats.lr > 0.0);
        }
        assert_eq!(opt.steps(), 200);
        assert!(w.abs().max().double_value(&[]) < 0.05);
    }

    #[test]
    fn the_update_matches_torch_adamw_on_one_step() {
        // torch.optim.AdamW(lr=0.1, weight_decay=0.5) on w = [1.0], grad 2.0, first step:
        // w·(1 − 0.05) − 0.1 · 2 / (2 + 1e-8) = 0.95 − 0.1 = 0.85.
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().var_copy("w", &Tensor::from_slice(&[1.0f32]));
        let config = AdamWConfig {
            weight_decay: 0.5,
            max_grad_norm: 0.0,
            ..AdamWConfig::default()
        };
        let mut opt = Optimizer::new(&vs, config, schedule()).unwrap();
        opt.backward_step(&(&w * 2.0).sum(Kind::Float));
        assert!((w.double_value(&[0]) - 0.85).abs() < 1e-6, "{w}");
    }

    #[test]
    fn a_restarted_optimizer_steps_as_a_fresh_one_at_its_place_in_the_schedule() {
        let config = AdamWConfig {
            max_grad_norm: 0.0,
            ..AdamWConfig::default()
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().var_copy("w", &Tensor::from_slice(&[1.0f32]));
        let mut fresh = Optimizer::new(&vs, config, schedule()).unwrap();
        fresh.backward_step(&(&w * 2.0).sum(Kind::Float));
        let first = w.double_value(&[0]);

        let vs2 = nn::VarStore::new(Device::Cpu);
        let mut w2 = vs2.root().var_copy("w", &Tensor::from_slice(&[-4.0f32]));
        let mut used = Optimizer::new(&vs2, config, schedule()).unwrap();
        for _ in 0..5 {
            used.backward_step(&(&w2 * -3.0).sum(Kind::Float));
        }
        // Back to the fresh one's weights: the moments of the other weights are forgotten.
        tch::no_grad(|| w2.copy_(&Tensor::from_slice(&[1.0f32])));
        used.restart(7);
        assert_eq!((used.steps(), used.moments_from()), (7, 7));
        let stats = used.backward_step(&(&w2 * 2.0).sum(Kind::Float));
        assert_eq!(stats.step, 7);
        assert!(
            (w2.double_value(&[0]) - first).abs() < 1e-6,
            "{w2} vs {first}"
        );
    }

    #[test]
    fn a_restored_optimizer_continues_exactly_where_the_saved_one_stopped() {
        let dir = std::env::temp_dir().join(format!("optim-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("optimizer.safetensors");
        let make = || {
            let vs = nn::VarStore::new(Device::Cpu);
            let w = vs
                .root()
                .var_copy("w", &Tensor::from_slice(&[2.0f32, -3.0]));
            (vs, w)
        };
        let loss = |w: &Tensor| (w.square() * Tensor::from_slice(&[1.0f32, 3.0])).sum(Kind::Float);

        let (vs, w) = make();
        let mut straight = Optimizer::new(&vs, AdamWConfig::default(), schedule()).unwrap();
        for _ in 0..3 {
            straight.backward_step(&loss(&w));
        }
        straight.save_state(&path).unwrap();
        let saved_w = w.copy();
        straight.backward_step(&loss(&w));

        let (vs2, mut w2) = make();
        tch::no_grad(|| w2.copy_(&saved_w));
        let mut resumed = Optimizer::new(&vs2, AdamWConfig::default(), schedule()).unwrap();
        resumed.load_state(&path, 3, 0).unwrap();
        assert_eq!(resumed.steps(), 3);
        resumed.backward_step(&loss(&w2));
        let (a, b) = (
            Vec::<f32>::try_from(&w).unwrap(),
            Vec::<f32>::try_from(&w2).unwrap(),
        );
        assert_eq!(a, b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
