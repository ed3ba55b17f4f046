//! The learning-rate schedule: linear warmup from 0, then constant or cosine decay to a floor.

use std::f64::consts::PI;

/// What happens after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decay {
    Constant,
    /// Half a cosine from the peak down to `min_lr` at `total_steps`.
    Cosine,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub peak_lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub decay: Decay,
}

impl LrSchedule {
    /// The rate for optimizer step `step` (0-based). Warmup reaches the peak on its last
    /// step, so the first update is already non-zero.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.decay {
            Decay::Constant => self.peak_lr,
            Decay::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
                let cosine = 0.5 * (1.0 + (PI * progress).cos());
                self.min_lr + (self.peak_lr - self.min_lr) * cosine
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(decay: Decay) -> LrSchedule {
        LrSchedule {
            peak_lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 4,
            total_steps: 14,
            decay,
        }
    }

    #[test]
    fn warmup_rises_linearly_to_the_peak() {
        let s = schedule(Decay::Cosine);
        let lrs: Vec<f64> = (0..4).map(|i| s.lr(i)).collect();
        assert_eq!(lrs, vec![2.5e-4, 5e-4, 7.5e-4, 1e-3]);
    }

    #[test]
    fn cosine_falls_from_the_peak_to_the_floor_and_stays_there() {
        let s = schedule(Decay::Cosine);
        assert!((s.lr(4) - 1e-3).abs() < 1e-12);
        // Halfway through the decay: the mean of peak and floor.
        assert!((s.lr(9) - 5.5e-4).abs() < 1e-12);
        assert!((s.lr(14) - 1e-4).abs() < 1e-12);
        assert!((s.lr(100) - 1e-4).abs() < 1e-12);
    }

    #[test]
    fn constant_holds_the_peak_after_warmup() {
        let s = schedule(Decay::Constant);
        assert_eq!(s.lr(4), 1e-3);
        assert_eq!(s.lr(1000), 1e-3);
    }
}
