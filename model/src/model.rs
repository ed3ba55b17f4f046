//! The Llama / Qwen2 / Qwen3 decoder: embeddings, a stack of pre-norm blocks
//! (RMSNorm → grouped-query attention with RoPE → RMSNorm → SwiGLU MLP), a final norm
//! and the language-model head (tied to the embeddings or separate).
//!
//! The base weights are frozen plain tensors; trainable state lives in a [`LoraAdapter`]
//! that each forward pass is handed (or not), so tenants share one copy of the base.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::config::{ConfigError, ModelConfig};
use crate::kv_cache::KvCache;
use crate::lora::{LoraAdapter, Target};
use crate::rope::{self, Rope};
use crate::weights::{Checkpoint, WeightsError};

/// What went wrong loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: i64, vocab: i64 },
    #[error("input ids must be a [batch, seq] integer tensor, got {kind:?} of shape {shape:?}")]
    InputShape { kind: Kind, shape: Vec<i64> },
    #[error("the KV cache was made for {cache} layers, the model has {model}")]
    CacheLayers { cache: usize, model: usize },
    #[error("reading a result tensor failed: {0}")]
    Tensor(String),
}

/// Which device and dtype the base weights live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub device: Device,
    pub kind: Kind,
}

impl Placement {
    /// CPU in f32: exact enough for parity tests and small models.
    pub fn cpu() -> Self {
        Placement {
            device: Device::Cpu,
            kind: Kind::Float,
        }
    }

    /// CUDA in bf16, the dtype checkpoints are trained and served in.
    pub fn cuda(ordinal: usize) -> Self {
        Placement {
            device: Device::Cuda(ordinal),
            kind: Kind::BFloat16,
        }
    }

    /// The first GPU when there is one, else the CPU.
    pub fn best_available() -> Self {
        if tch::Cuda::is_available() {
            Self::cuda(0)
        } else {
            Self::cpu()
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;

    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::best_available()),
            "cpu" => Ok(Self::cpu()),
            "cuda" => Ok(Self::cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::cuda)
                .ok_or_else(|| format!("unknown device {s:?} (auto, cpu, cuda, cuda:N)")),
        }
    }
}

struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    fn load(
        ck: &mut Checkpoint,
        prefix: &str,
        (fan_in, fan_out): (i64, i64),
        bias: bool,
    ) -> Result<Self, WeightsError> {
        Ok(Linear {
            weight: ck.take(&format!("{prefix}.weight"), &[fan_out, fan_in])?,
            bias: if bias {
                Some(ck.take(&format!("{prefix}.bias"), &[fan_out])?)
            } else {
                None
            },
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

/// RMSNorm as transformers computes it: statistics in f32, the weight applied after
/// casting back to the input dtype.
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn load(ck: &mut Checkpoint, name: &str, dim: i64, eps: f64) -> Result<Self, WeightsError> {
        Ok(RmsNorm {
            weight: ck.take(name, &[dim])?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let x32 = x.to_kind(Kind::Float);
        let variance = x32.square().mean_dim(-1, true, Kind::Float);
        let normed = x32 * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(x.kind())
    }
}

/// The adapter, if any, that a forward pass applies, and whether it is training
/// (LoRA dropout is active only then).
#[derive(Clone, Copy)]
struct Adapted<'a> {
    adapter: Option<&'a LoraAdapter>,
    train: bool,
}

impl Adapted<'_> {
    fn project(&self, linear: &Linear, x: &Tensor, layer: usize, target: Target) -> Tensor {
        let base = linear.forward(x);
        match self
            .adapter
            .and_then(|a| a.delta(x, layer, target, self.train))
        {
            Some(delta) => base + delta,
            None => base,
        }
    }
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    num_heads: i64,
    num_kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn load(ck: &mut Checkpoint, prefix: &str, c: &ModelConfig) -> Result<Self, WeightsError> {
        let p = |m: &str| format!("{prefix}.{m}");
        let (q_norm, k_norm) = if c.qk_norm {
            (
                Some(RmsNorm::load(
                    ck,
                    &p("q_norm.weight"),
                    c.head_dim,
                    c.rms_norm_eps,
                )?),
                Some(RmsNorm::load(
                    ck,
                    &p("k_norm.weight"),
                    c.head_dim,
                    c.rms_norm_eps,
                )?),
            )
        } else {
            (None, None)
        };
        Ok(Attention {
            q_proj: Linear::load(ck, &p("q_proj"), Target::Q.dims(c), c.qkv_bias)?,
            k_proj: Linear::load(ck, &p("k_proj"), Target::K.dims(c), c.qkv_bias)?,
            v_proj: Linear::load(ck, &p("v_proj"), Target::V.dims(c), c.qkv_bias)?,
            o_proj: Linear::load(ck, &p("o_proj"), Target::O.dims(c), c.o_bias)?,
            q_norm,
            k_norm,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        })
    }

    /// `x` is `[batch, seq, hidden]`; `cos`/`sin` cover the positions of `x`;
    /// `cache` holds this layer's keys and values of the positions before them.
    fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        (cos, sin): (&Tensor, &Tensor),
        cache: Option<&mut KvCache>,
        ad: Adapted,
    ) -> Tensor {
        let (batch, seq) = (x.size()[0], x.size()[1]);
        let heads = |t: Tensor, n: i64, norm: &Option<RmsNorm>| {
            let t = t.view([batch, seq, n, self.head_dim]);
            let t = match norm {
                Some(norm) => norm.forward(&t),
                None => t,
            };
            t.transpose(1, 2)
        };
        let q = heads(
            ad.project(&self.q_proj, x, layer, Target::Q),
            self.num_heads,
            &self.q_norm,
        );
        let k = heads(
            ad.project(&self.k_proj, x, layer, Target::K),
            self.num_kv_heads,
            &self.k_norm,
        );
        let v = heads(
            ad.project(&self.v_proj, x, layer, Target::V),
            self.num_kv_heads,
            &None,
        );
        let q = rope::apply(&q, cos, sin);
        let k = rope::apply(&k, cos, sin);

        let (k, v, past) = match cache {
            Some(cache) => {
                let past = cache.len();
                let (k, v) = cache.append(layer, k, v);
                (k, v, past)
            }
            None => (k, v, 0),
        };
        // One new token sees every cached key: no mask, so fused kernels stay available.
        let out = if past == 0 || seq == 1 {
            Tensor::scaled_dot_product_attention::<Tensor>(
                &q,
                &k,
                &v,
                None,
                0.0,
                past == 0 && seq > 1,
                None,
                true,
            )
        } else {
            // New queries sit at positions past..past+seq and see every key up to their own
            // position; SDPA's is_causal would align them to the start instead.
            let total = past + seq;
            let mask = Tensor::ones([seq, total], (Kind::Bool, x.device())).tril(past);
            Tensor::scaled_dot_product_attention(&q, &k, &v, Some(mask), 0.0, false, None, true)
        };
        let out = out
            .transpose(1, 2)
            .reshape([batch, seq, self.num_heads * self.head_dim]);
        ad.project(&self.o_proj, &out, layer, Target::O)
    }
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn load(ck: &mut Checkpoint, prefix: &str, c: &ModelConfig) -> Result<Self, WeightsError> {
        let p = |m: &str| format!("{prefix}.{m}");
        Ok(Mlp {
            gate_proj: Linear::load(ck, &p("gate_proj"), Target::Gate.dims(c), c.mlp_bias)?,
            up_proj: Linear::load(ck, &p("up_proj"), Target::Up.dims(c), c.mlp_bias)?,
            down_proj: Linear::load(ck, &p("down_proj"), Target::Down.dims(c), c.mlp_bias)?,
        })
    }

    fn forward(&self, x: &Tensor, layer: usize, ad: Adapted) -> Tensor {
        let gate = ad.project(&self.gate_proj, x, layer, Target::Gate).silu();
        let up = ad.project(&self.up_proj, x, layer, Target::Up);
        ad.project(&self.down_proj, &(gate * up), layer, Target::Down)
    }
}

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// A loaded decoder with frozen weights.
pub struct Model {
    config: ModelConfig,
    placement: Placement,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// None when tied to `embed_tokens`.
    lm_head: Option<Tensor>,
    rope: Rope,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("placement", &self.placement)
            .finish()
    }
}

impl Model {
    /// Loads `config.json` and the safetensors checkpoint of an HF model folder.
    pub fn load(dir: &Path, placement: Placement) -> Result<Self, ModelError> {
        let config = ModelConfig::from_dir(dir)?;
        let mut ck = Checkpoint::load(dir, placement.device, placement.kind)?;
        Self::from_checkpoint(config, &mut ck, placement)
    }

    /// A model of `config` with random weights, initialised as transformers does
    /// (see [`Checkpoint::random`]).
    pub fn random(config: ModelConfig, placement: Placement) -> Result<Self, ModelError> {
        let mut ck = Checkpoint::random(placement.device, placement.kind, 0.02);
        Self::from_checkpoint(config, &mut ck, placement)
    }

    /// Builds the model from the tensors of `ck`, checking every shape against `config`.
    pub fn from_checkpoint(
        config: ModelConfig,
        ck: &mut Checkpoint,
        placement: Placement,
    ) -> Result<Self, ModelError> {
        let c = &config;
        let embed_tokens = ck.take("model.embed_tokens.weight", &[c.vocab_size, c.hidden_size])?;
        let mut layers = Vec::with_capacity(c.num_layers as usize);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            layers.push(DecoderLayer {
                input_layernorm: RmsNorm::load(
                    ck,
                    &format!("{p}.input_layernorm.weight"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                self_attn: Attention::load(ck, &format!("{p}.self_attn"), c)?,
                post_attention_layernorm: RmsNorm::load(
                    ck,
                    &format!("{p}.post_attention_layernorm.weight"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                mlp: Mlp::load(ck, &format!("{p}.mlp"), c)?,
            });
        }
        let norm = RmsNorm::load(ck, "model.norm.weight", c.hidden_size, c.rms_norm_eps)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(ck.take("lm_head.weight", &[c.vocab_size, c.hidden_size])?)
        };
        let rope = Rope::new(c, placement.device);
        Ok(Model {
            config,
            placement,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Parameters in the base model (embeddings counted once when tied).
    pub fn num_parameters(&self) -> i64 {
        parameter_count(&self.config)
    }

    /// Logits `[batch, seq, vocab]` for `input_ids` `[batch, seq]`, causally masked.
    /// Right padding needs no mask: padded positions come after every real token.
    /// `train` turns on LoRA dropout.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        adapter: Option<&LoraAdapter>,
        train: bool,
    ) -> Result<Tensor, ModelError> {
        self.run(input_ids, Adapted { adapter, train }, None)
    }

    /// Logits for `input_ids` that continue the sequence held in `cache`, which is
    /// extended with their keys and values. Used for generation, never for training.
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        adapter: Option<&LoraAdapter>,
        cache: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        if cache.num_layers() != self.layers.len() {
            return Err(ModelError::CacheLayers {
                cache: cache.num_layers(),
                model: self.layers.len(),
            });
        }
        let train = false;
        self.run(input_ids, Adapted { adapter, train }, Some(cache))
    }

    /// An empty cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }

    fn run(
        &self,
        input_ids: &Tensor,
        ad: Adapted,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        self.check_ids(input_ids)?;
        let seq = input_ids.size()[1];
        let offset = cache.as_ref().map_or(0, |c| c.len());
        let (cos, sin) = self.rope.cos_sin(offset, seq, self.placement.kind);
        let ids = input_ids.to_device(self.placement.device);
        let mut h = Tensor::embedding(&self.embed_tokens, &ids, -1, false, false);
        for (i, layer) in self.layers.iter().enumerate() {
            let attn_in = layer.input_layernorm.forward(&h);
            let attn = layer
                .self_attn
                .forward(&attn_in, i, (&cos, &sin), cache.as_deref_mut(), ad);
            // Not `+=`: an in-place add would clobber the tensor the norm saved for backward.
            h = &h + attn;
            let mlp_in = layer.post_attention_layernorm.forward(&h);
            h = &h + layer.mlp.forward(&mlp_in, i, ad);
        }
        if let Some(cache) = cache {
            cache.advance(seq);
        }
        let h = self.norm.forward(&h);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        Ok(h.linear::<Tensor>(head, None))
    }

    fn check_ids(&self, ids: &Tensor) -> Result<(), ModelError> {
        let shape = ids.size();
        if shape.len() != 2 || !matches!(ids.kind(), Kind::Int64 | Kind::Int) {
            return Err(ModelError::InputShape {
                kind: ids.kind(),
                shape,
            });
        }
        if ids.numel() == 0 {
            return Ok(());
        }
        let vocab = self.config.vocab_size;
        for id in [ids.max().int64_value(&[]), ids.min().int64_value(&[])] {
            if id < 0 || id >= vocab {
                return Err(ModelError::TokenOutOfRange { id, vocab });
            }
        }
        Ok(())
    }
}

/// Parameters of a model of `c` (embeddings counted once when tied), without building it.
pub fn parameter_count(c: &ModelConfig) -> i64 {
    let projections: i64 = Target::ALL
        .iter()
        .map(|t| {
            let (fan_in, fan_out) = t.dims(c);
            fan_in * fan_out
        })
        .sum();
    let norms = 2 * c.hidden_size + if c.qk_norm { 2 * c.head_dim } else { 0 };
    let embeddings = c.vocab_size * c.hidden_size;
    let head = if c.tie_word_embeddings { 0 } else { embeddings };
    embeddings + c.num_layers * (projections + norms) + c.hidden_size + head
}
