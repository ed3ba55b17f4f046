//! The decoder's hyper-parameters, read from a Hugging Face `config.json`.
//!
//! One struct covers the Llama, Qwen2 and Qwen3 families: they differ only in which
//! projections carry biases and whether queries/keys are normalised per head. Both the
//! transformers 4.x layout (`rope_theta` + `rope_scaling`) and the 5.x layout
//! (`rope_parameters`) are understood, because checkpoints in the wild use both.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::json_file::{self, JsonFileError};

/// What went wrong reading a model's `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] JsonFileError),
    #[error("not a valid model config: {0}")]
    Parse(#[source] serde_json::Error),
    #[error("model_type {0:?} is not a Llama/Qwen2/Qwen3-family decoder")]
    UnsupportedModelType(String),
    #[error("hidden_act {0:?} is not supported (only silu)")]
    UnsupportedActivation(String),
    #[error("rope scaling type {0:?} is not supported (default, linear and llama3 are)")]
    UnsupportedRopeScaling(String),
    #[error("rope scaling {kind:?} needs the field {field}")]
    MissingRopeField { kind: String, field: &'static str },
    #[error("sliding-window attention is not supported")]
    SlidingWindow,
    #[error("{heads} attention heads are not a multiple of {kv_heads} key/value heads")]
    HeadGrouping { heads: i64, kv_heads: i64 },
    #[error("hidden_size {hidden} is not divisible by {heads} heads and no head_dim is given")]
    HeadDim { hidden: i64, heads: i64 },
}

/// Which checkpoint layout the weights follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2,
    Qwen3,
}

/// How RoPE frequencies are stretched for contexts longer than the model was trained on.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain frequencies.
    None,
    /// Positions divided by `factor` (all frequencies scaled alike).
    Linear { factor: f64 },
    /// Llama 3.1's piecewise scaling: long wavelengths scaled, short ones kept, a smooth
    /// blend in between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// Everything the model needs to lay out its tensors and compute a forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub num_kv_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: i64,
    pub tie_word_embeddings: bool,
    /// Biases on q, k and v (Qwen2 always; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the output projection (Llama with `attention_bias`).
    pub o_bias: bool,
    /// Biases on gate, up and down (Llama with `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
}

/// The raw `config.json` fields we read; everything else in the file is ignored on purpose,
/// since HF configs carry dozens of fields that do not change the forward pass.
#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: String,
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    #[serde(default = "default_max_positions")]
    max_position_embeddings: i64,
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default)]
    use_sliding_window: bool,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_positions() -> i64 {
    2048
}
fn default_act() -> String {
    "silu".to_owned()
}

impl ModelConfig {
    /// Reads `config.json` from a model folder.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        let raw: RawConfig = json_file::read(&dir.join("config.json"))?;
        raw.try_into()
    }

    /// Parses the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_json::from_str(text).map_err(ConfigError::Parse)?;
        raw.try_into()
    }

    /// Query heads that share one key/value head.
    pub fn kv_group_size(&self) -> i64 {
        self.num_heads / self.num_kv_heads
    }
}

impl TryFrom<RawConfig> for ModelConfig {
    type Error = ConfigError;

    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let family = match raw.model_type.as_str() {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            other => return Err(ConfigError::UnsupportedModelType(other.to_owned())),
        };
        if raw.hidden_act != "silu" {
            return Err(ConfigError::UnsupportedActivation(raw.hidden_act));
        }
        if raw.use_sliding_window {
            return Err(ConfigError::SlidingWindow);
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if num_kv_heads <= 0 || raw.num_attention_heads % num_kv_heads != 0 {
            return Err(ConfigError::HeadGrouping {
                heads: raw.num_attention_heads,
                kv_heads: num_kv_heads,
            });
        }
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None if raw.num_attention_heads > 0
                && raw.hidden_size % raw.num_attention_heads == 0 =>
            {
                raw.hidden_size / raw.num_attention_heads
            }
            None => {
                return Err(ConfigError::HeadDim {
                    hidden: raw.hidden_size,
                    heads: raw.num_attention_heads,
                })
            }
        };
        // transformers 5 folds theta and scaling into one `rope_parameters` object.
        let rope_params = raw.rope_parameters.as_ref();
        let rope_theta = raw
            .rope_theta
            .or_else(|| rope_params.and_then(|p| p.get("rope_theta")?.as_f64()))
            .unwrap_or(10_000.0);
        let rope_scaling = match raw.rope_scaling.as_ref().or(rope_params) {
            Some(v) if !v.is_null() => parse_rope_scaling(v)?,
            _ => RopeScaling::None,
        };
        let (qkv_bias, o_bias, qk_norm) = match family {
            Family::Llama => (raw.attention_bias, raw.attention_bias, false),
            Family::Qwen2 => (true, false, false),
            Family::Qwen3 => (raw.attention_bias, raw.attention_bias, true),
        };
        Ok(ModelConfig {
            family,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings,
            // LlamaConfig, Qwen2Config and Qwen3Config all default to a separate lm_head.
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: raw.mlp_bias,
            qk_norm,
            bos_token_id: raw.bos_token_id.as_ref().and_then(Value::as_i64),
            eos_token_ids: token_id_list(raw.eos_token_id.as_ref()),
        })
    }
}

/// `eos_token_id` is either one id or a list of them (Llama 3 instruct has several).
fn token_id_list(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

fn parse_rope_scaling(v: &Value) -> Result<RopeScaling, ConfigError> {
    // Older configs spell the kind `type`, newer ones `rope_type`.
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    let field = |name: &'static str| {
        v.get(name)
            .and_then(Value::as_f64)
            .ok_or_else(|| ConfigError::MissingRopeField {
                kind: kind.clone(),
                field: name,
            })
    };
    match kind.as_str() {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: field("factor")?,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: field("factor")?,
            low_freq_factor: field("low_freq_factor")?,
            high_freq_factor: field("high_freq_factor")?,
            original_max_position_embeddings: field("original_max_position_embeddings")?,
        }),
        _ => Err(ConfigError::UnsupportedRopeScaling(kind)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN2_5_0_5B: &str = r#"{
      "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
      "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
      "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
      "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
      "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
      "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
      "vocab_size": 151936
    }"#;

    #[test]
    fn a_qwen2_5_config_has_qkv_biases_and_tied_embeddings() {
        let c = ModelConfig::from_json(QWEN2_5_0_5B).unwrap();
        assert_eq!(c.family, Family::Qwen2);
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.kv_group_size(), 7);
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm && c.tie_word_embeddings);
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert_eq!(c.eos_token_ids, vec![151645]);
    }

    #[test]
    fn a_llama_3_1_config_reads_llama3_rope_scaling_and_several_eos_ids() {
        let text = r#"{"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
          "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
          "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
          "tie_word_embeddings": false, "eos_token_id": [128001, 128008, 128009]}"#;
        let c = ModelConfig::from_json(text).unwrap();
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0
            }
        );
        assert_eq!(c.eos_token_ids.len(), 3);
        assert!(!c.qkv_bias && !c.tie_word_embeddings);
    }

    #[test]
    fn transformers_5_rope_parameters_carry_theta_and_scaling() {
        let text = r#"{"model_type": "qwen3", "vocab_size": 300, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 32,
          "rope_parameters": {"rope_theta": 20000.0, "rope_type": "linear", "factor": 2.0}}"#;
        let c = ModelConfig::from_json(text).unwrap();
        assert_eq!(c.rope_theta, 20_000.0);
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        assert!(c.qk_norm);
        assert_eq!(c.head_dim, 32);
    }

    #[test]
    fn unsupported_families_and_scalings_are_named() {
        let gpt2 = r#"{"model_type": "gpt2", "vocab_size": 1, "hidden_size": 1,
          "intermediate_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1}"#;
        assert!(matches!(
            ModelConfig::from_json(gpt2),
            Err(ConfigError::UnsupportedModelType(t)) if t == "gpt2"
        ));
        let yarn = r#"{"model_type": "qwen2", "vocab_size": 1, "hidden_size": 4,
          "intermediate_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
          "rope_scaling": {"type": "yarn", "factor": 4.0}}"#;
        assert!(matches!(
            ModelConfig::from_json(yarn),
            Err(ConfigError::UnsupportedRopeScaling(t)) if t == "yarn"
        ));
    }
}
