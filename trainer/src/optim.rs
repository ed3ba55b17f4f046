//! One optimizer step over an adapter's parameters: AdamW, the global gradient norm clipped
//! to a maximum, and the learning rate taken from the schedule.

use tch::{nn, nn::OptimizerConfig, Kind, TchError, Tensor};

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

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    pub step: u64,
    pub lr: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
}

/// AdamW over the variables of one `VarStore` (an adapter's), with clipping and a schedule.
pub struct Optimizer {
    inner: nn::Optimizer,
    variables: Vec<Tensor>,
    schedule: LrSchedule,
    max_grad_norm: f64,
    step: u64,
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
    ) -> Result<Self, TchError> {
        let adamw = nn::AdamW {
            beta1: config.beta1,
            beta2: config.beta2,
            wd: config.weight_decay,
            eps: config.eps,
            amsgrad: false,
        };
        let inner = adamw.build(vars, schedule.lr(0))?;
        Ok(Optimizer {
            inner,
            variables: vars.trainable_variables(),
            schedule,
            max_grad_norm: config.max_grad_norm,
            step: 0,
        })
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
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

    fn apply(&mut self) -> StepStats {
        let grad_norm = self.clip_gradients();
        let lr = self.schedule.lr(self.step);
        self.inner.set_lr(lr);
        self.inner.step();
        self.inner.zero_grad();
        let stats = StepStats {
            step: self.step,
            lr,
            grad_norm,
        };
        self.step += 1;
        stats
    }

    /// Scales every gradient by `max / norm` when the global norm exceeds `max`.
    fn clip_gradients(&self) -> f64 {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self
                .variables
                .iter()
                .map(|v| v.grad())
                .filter(|g| g.defined())
                .collect();
            let squares: f64 = grads
                .iter()
                .map(|g| g.square().sum(Kind::Float).double_value(&[]))
                .sum();
            let norm = squares.sqrt();
            if self.max_grad_norm > 0.0 && norm > self.max_grad_norm {
                let scale = self.max_grad_norm / (norm + 1e-6);
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
}
