//! A tiny random model written as a real HF folder — `config.json`, `model.safetensors`, a
//! byte-level BPE `tokenizer.json` with Qwen's special tokens and the Qwen2.5 chat template in
//! `tokenizer_config.json` — for tests and the demo, where no weights can be downloaded.
//! Everything that reads an HF folder (`Model::load`, `Tokenizer::from_dir`, `serve`, `train`)
//! reads it like any other.

use std::path::Path;

use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::lora::Target;

/// Qwen's special tokens, ids 256, 257 and 258 after the 256 byte tokens.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// `<|im_end|>`: the end of a turn, and the model's EOS.
pub const EOS_ID: i64 = 258;
/// 256 bytes, the three specials, `<tool_call>` and `</tool_call>`.
pub const VOCAB: i64 = 261;

/// The shape and the seed of a tiny Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyModel {
    pub layers: i64,
    pub hidden: i64,
    pub intermediate: i64,
    pub heads: i64,
    pub kv_heads: i64,
    /// Standard deviation of the random weights. Wider than transformers' 0.02: a random model
    /// then has preferences, so sampled outputs differ between weights and adapters.
    pub init_std: f64,
    /// Seeds torch's global generator before drawing; callers running in parallel with other
    /// torch draws must serialise around [`TinyModel::write`] for the seed to mean anything.
    pub seed: i64,
}

impl TinyModel {
    /// The smallest shape vLLM's CPU backend serves: its attention wants a head size of at
    /// least 32 (hidden 64 over 2 heads).
    pub fn for_vllm(seed: i64) -> Self {
        Self {
            hidden: 64,
            intermediate: 128,
            heads: 2,
            kv_heads: 1,
            seed,
            ..Self::default()
        }
    }
}

impl Default for TinyModel {
    fn default() -> Self {
        Self {
            layers: 2,
            hidden: 32,
            intermediate: 64,
            heads: 4,
            kv_heads: 2,
            init_std: 0.3,
            seed: 0,
        }
    }
}

/// Writing a tiny model folder failed.
#[derive(Debug, thiserror::Error)]
pub enum TinyModelError {
    #[error("writing {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the tiny model's config: {0}")]
    Config(String),
    #[error("writing the weights: {0}")]
    Weights(#[from] tch::TchError),
}

impl TinyModel {
    /// What `config.json` holds.
    pub fn config_json(&self) -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
            "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "tie_word_embeddings": true,
            "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "bos_token_id": 256, "eos_token_id": EOS_ID, "torch_dtype": "float32"
        })
    }

    /// Writes the folder (created if missing): config, random weights, tokenizer, template.
    pub fn write(&self, dir: &Path) -> Result<(), TinyModelError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| TinyModelError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let config_text = self.config_json().to_string();
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, &config_text).map_err(io(&config_path))?;
        let config = ModelConfig::from_json(&config_text)
            .map_err(|e| TinyModelError::Config(e.to_string()))?;
        tch::manual_seed(self.seed);
        let randn =
            |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)) * self.init_std;
        let ones = || Tensor::ones([self.hidden], (Kind::Float, Device::Cpu));
        let mut named: Vec<(String, Tensor)> = vec![
            (
                "model.embed_tokens.weight".into(),
                randn(&[VOCAB, self.hidden]),
            ),
            ("model.norm.weight".into(), ones()),
        ];
        for layer in 0..self.layers {
            let p = format!("model.layers.{layer}");
            for norm in ["input_layernorm", "post_attention_layernorm"] {
                named.push((format!("{p}.{norm}.weight"), ones()));
            }
            for target in Target::ALL {
                let (fan_in, fan_out) = target.dims(&config);
                let name = format!("{p}.{}.{}.weight", target.block(), target.module_name());
                named.push((name, randn(&[fan_out, fan_in])));
            }
        }
        let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Tensor::write_safetensors(&refs, dir.join("model.safetensors"))?;
        write_tokenizer(dir).map_err(io(dir))
    }
}

/// GPT-2's byte → printable character table, which byte-level BPE vocabularies are made of.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from(b as u8)
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or('?')
            }
        })
        .collect()
}

/// A byte-level BPE without merges (id = byte value) plus Qwen's special and tool-call tokens.
fn write_tokenizer(dir: &Path) -> std::io::Result<()> {
    let vocab: serde_json::Map<String, Value> = byte_chars()
        .into_iter()
        .enumerate()
        .map(|(b, c)| (c.to_string(), json!(b)))
        .collect();
    let added = |id: usize, content: &str, special: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": special})
    };
    let mut added_tokens: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| added(256 + i, t, true))
        .collect();
    added_tokens.push(added(259, "<tool_call>", false));
    added_tokens.push(added(260, "</tool_call>", false));
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())?;
    let config = json!({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": null,
        "model_max_length": 1024, "chat_template": QWEN2_5_TEMPLATE
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string())
}

/// The Qwen2.5 chat template, tools included (as `tests/parity/fixtures.py` has it).
pub const QWEN2_5_TEMPLATE: &str = concat!(
    "{%- if tools %}\n",
    "    {{- '<|im_start|>system\\n' }}\n",
    "    {%- if messages[0]['role'] == 'system' %}\n",
    "        {{- messages[0]['content'] }}\n",
    "    {%- else %}\n",
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n",
    "    {%- endif %}\n",
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n",
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n",
    "    {%- for tool in tools %}\n",
    "        {{- \"\\n\" }}\n",
    "        {{- tool | tojson }}\n",
    "    {%- endfor %}\n",
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and ",
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, ",
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n",
    "{%- else %}\n",
    "    {%- if messages[0]['role'] == 'system' %}\n",
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n",
    "    {%- else %}\n",
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful ",
    "assistant.<|im_end|>\\n' }}\n",
    "    {%- endif %}\n",
    "{%- endif %}\n",
    "{%- for message in messages %}\n",
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or ",
    "(message.role == \"assistant\" and not message.tool_calls) %}\n",
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n",
    "    {%- elif message.role == \"assistant\" %}\n",
    "        {{- '<|im_start|>' + message.role }}\n",
    "        {%- if message.content %}\n",
    "            {{- '\\n' + message.content }}\n",
    "        {%- endif %}\n",
    "        {%- for tool_call in message.tool_calls %}\n",
    "            {%- if tool_call.function is defined %}\n",
    "                {%- set tool_call = tool_call.function %}\n",
    "            {%- endif %}\n",
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n",
    "            {{- tool_call.name }}\n",
    "            {{- '\", \"arguments\": ' }}\n",
    "            {{- tool_call.arguments | tojson }}\n",
    "            {{- '}\\n</tool_call>' }}\n",
    "        {%- endfor %}\n",
    "        {{- '<|im_end|>\\n' }}\n",
    "    {%- elif message.role == \"tool\" %}\n",
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n",
    "            {{- '<|im_start|>user' }}\n",
    "        {%- endif %}\n",
    "        {{- '\\n<tool_response>\\n' }}\n",
    "        {{- message.content }}\n",
    "        {{- '\\n</tool_response>' }}\n",
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n",
    "            {{- '<|im_end|>\\n' }}\n",
    "        {%- endif %}\n",
    "    {%- endif %}\n",
    "{%- endfor %}\n",
    "{%- if add_generation_prompt %}\n",
    "    {{- '<|im_start|>assistant\\n' }}\n",
    "{%- endif %}\n",
);
