//! Rotary position embeddings: the inverse frequencies (with linear or Llama 3 scaling)
//! and their application to queries and keys.
//!
//! The frequencies are computed the way transformers computes them — `inv_freq` in f32,
//! the angle `position · inv_freq` in f32, then cos/sin — so that f32 logits agree to
//! 1e-5 rather than drifting with the position.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use crate::config::{ModelConfig, RopeScaling};

/// The per-dimension rotation speeds for one head size.
#[derive(Debug)]
pub struct Rope {
    /// `[head_dim / 2]`, f32.
    inv_freq: Tensor,
}

impl Rope {
    pub fn new(config: &ModelConfig, device: Device) -> Self {
        let freqs = inverse_frequencies(config.head_dim, config.rope_theta, &config.rope_scaling);
        Rope {
            inv_freq: Tensor::from_slice(&freqs).to_device(device),
        }
    }

    /// cos and sin for positions `offset..offset + len`, each `[len, head_dim]` in `kind`.
    pub fn cos_sin(&self, offset: i64, len: i64, kind: Kind) -> (Tensor, Tensor) {
        let device = self.inv_freq.device();
        let positions = Tensor::arange_start(offset, offset + len, (Kind::Float, device));
        let angles = positions.unsqueeze(1) * self.inv_freq.unsqueeze(0);
        // The two halves of a head rotate with the same frequencies (rotate_half layout).
        let emb = Tensor::cat(&[&angles, &angles], -1);
        (emb.cos().to_kind(kind), emb.sin().to_kind(kind))
    }
}

/// Rotates `x` `[batch, heads, seq, head_dim]` by the angles whose cos/sin are `[seq, head_dim]`.
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let x1 = x.narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    let rotated = Tensor::cat(&[&x2.neg(), &x1], 3);
    x * cos + rotated * sin
}

/// `inv_freq[i] = 1 / theta^(2i / head_dim)`, then scaled. Rounded to f32 at the same point
/// transformers rounds, so both sides rotate by the same angles.
pub fn inverse_frequencies(head_dim: i64, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    let base: Vec<f32> = (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            1.0 / (theta as f32).powf(exponent)
        })
        .collect();
    match *scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_context,
        } => {
            let low_freq_wavelen = old_context / low_freq_factor;
            let high_freq_wavelen = old_context / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let f = f as f64;
                    let wavelen = 2.0 * PI / f;
                    let scaled = if wavelen > low_freq_wavelen {
                        f / factor
                    } else if wavelen < high_freq_wavelen {
                        f
                    } else {
                        let smooth = (old_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    };
                    scaled as f32
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frequencies_fall_geometrically_from_one() {
        let f = inverse_frequencies(8, 10_000.0, &RopeScaling::None);
        let expected = [1.0, 0.1, 0.01, 0.001];
        for (got, want) in f.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn linear_scaling_divides_every_frequency() {
        let f = inverse_frequencies(4, 100.0, &RopeScaling::Linear { factor: 4.0 });
        assert_eq!(f, vec![0.25, 0.025]);
    }

    #[test]
    fn llama3_scaling_keeps_fast_dims_slows_slow_dims_and_blends_between() {
        // head_dim 8, theta 10000: wavelengths 2π, 62.8, 628, 6283.
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 1024.0,
        };
        let f = inverse_frequencies(8, 10_000.0, &scaling);
        // wavelen < 1024/4 = 256: unchanged.
        assert!((f[0] - 1.0).abs() < 1e-6 && (f[1] - 0.1).abs() < 1e-7);
        // 256 ≤ wavelen ≤ 1024: smooth = (1024/628.3 - 1)/3 = 0.2099.
        let smooth = (1024.0 / (2.0 * PI / 0.01) - 1.0) / 3.0;
        let want = (1.0 - smooth) * 0.01 / 8.0 + smooth * 0.01;
        assert!((f[2] as f64 - want).abs() < 1e-8, "{} vs {want}", f[2]);
        // wavelen > 1024: divided by the factor.
        assert!((f[3] - 0.001 / 8.0).abs() < 1e-9);
    }

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let config_like = RopeScaling::None;
        let rope = Rope {
            inv_freq: Tensor::from_slice(&inverse_frequencies(4, 10_000.0, &config_like)),
        };
        let x = Tensor::randn([1, 1, 3, 4], (Kind::Float, Device::Cpu));
        let (cos, sin) = rope.cos_sin(0, 3, Kind::Float);
        let y = apply(&x, &cos, &sin);
        let diff0 = (y.narrow(2, 0, 1) - x.narrow(2, 0, 1))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff0 < 1e-7);
        let norms = |t: &Tensor| t.square().sum_dim_intlist(-1, false, Kind::Float);
        let dn = (norms(&y) - norms(&x)).abs().max().double_value(&[]);
        assert!(dn < 1e-5);
    }
}
