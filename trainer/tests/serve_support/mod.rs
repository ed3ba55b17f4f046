//! What the serve tests stand on: tiny random HF model folders written to disk (config,
//! safetensors, a byte-level BPE `tokenizer.json` with Qwen's special tokens, and the
//! Qwen2.5 chat template), PEFT adapters, a server on a loopback port, and a small client
//! that reads SSE streams.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clawback_trainer::config::ModelConfig;
use clawback_trainer::lora::{LoraAdapter, LoraConfig};
use clawback_trainer::model::Placement;
use clawback_trainer::serve::{ServeOptions, Server};
use clawback_trainer::{ChatInput, ChatTemplate, Target, Tokenizer};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

pub const BASE: &str = "tiny-qwen";
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const EOS_ID: i64 = 258;
pub const VOCAB: i64 = 261;

/// torch's generator is global and the tests run in parallel: whoever seeds it draws alone,
/// so that a seed always gives the same weights.
static TORCH_RNG: Mutex<()> = Mutex::new(());

fn torch_rng() -> std::sync::MutexGuard<'static, ()> {
    TORCH_RNG
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A fresh folder under cargo's per-test-target temp dir.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("serve-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn config_json(layers: i64) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": true,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "bos_token_id": 256, "eos_token_id": EOS_ID, "torch_dtype": "float32"
    })
}

/// Writes a random model folder (weights from `seed`) that `serve --model` can load.
pub fn write_model(dir: &Path, seed: i64, layers: i64) {
    let config_text = config_json(layers).to_string();
    std::fs::write(dir.join("config.json"), &config_text).unwrap();
    let config = ModelConfig::from_json(&config_text).unwrap();
    let _rng = torch_rng();
    tch::manual_seed(seed);
    // Wider than transformers' 0.02: a random model then has preferences, so greedy
    // outputs differ between weights and adapters.
    let randn = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.3;
    let h = config.hidden_size;
    let mut named: Vec<(String, Tensor)> = vec![
        ("model.embed_tokens.weight".into(), randn(&[VOCAB, h])),
        (
            "model.norm.weight".into(),
            Tensor::ones([h], (Kind::Float, Device::Cpu)),
        ),
    ];
    for layer in 0..layers {
        let p = format!("model.layers.{layer}");
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            named.push((
                format!("{p}.{norm}.weight"),
                Tensor::ones([h], (Kind::Float, Device::Cpu)),
            ));
        }
        for target in Target::ALL {
            let (fan_in, fan_out) = target.dims(&config);
            let name = format!("{p}.{}.{}.weight", target.block(), target.module_name());
            named.push((name, randn(&[fan_out, fan_in])));
        }
    }
    let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&refs, dir.join("model.safetensors")).unwrap();
    write_tokenizer(dir);
}

/// GPT-2's byte → printable character table, which byte-level BPE vocabularies are made of.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// A byte-level BPE without merges (id = byte value) plus Qwen's special and tool-call tokens.
fn write_tokenizer(dir: &Path) {
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
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = json!({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": null,
        "model_max_length": 1024, "chat_template": QWEN2_5_TEMPLATE
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// Writes a PEFT adapter for the model in `model_dir` whose B factors are random, so that it
/// changes the model's outputs (a fresh adapter's B is zero).
pub fn write_adapter(model_dir: &Path, dir: &Path, seed: i64, rank: i64) {
    let config = ModelConfig::from_dir(model_dir).unwrap();
    let _rng = torch_rng();
    tch::manual_seed(seed);
    let lora = LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        ..LoraConfig::default()
    };
    let adapter = LoraAdapter::new(&config, lora, Device::Cpu).unwrap();
    tch::no_grad(|| {
        for (_, mut var) in adapter.var_store().variables() {
            let noise = Tensor::randn_like(&var) * 0.5;
            var.copy_(&noise);
        }
    });
    adapter.save(dir, Some(BASE)).unwrap();
}

/// A server for the model in `dir`, named [`BASE`], on a free loopback port.
pub async fn start(dir: &Path) -> Server {
    // Ops this small gain nothing from a second thread.
    tch::set_num_threads(1);
    Server::start(ServeOptions {
        model: dir.to_owned(),
        served_model_name: Some(BASE.to_owned()),
        adapters: Vec::new(),
        placement: Placement::cpu(),
        max_num_seqs: 8,
        addr: "127.0.0.1:0".parse().unwrap(),
    })
    .await
    .unwrap()
}

/// The prompt ids the server should send the model for `messages`.
pub fn expected_prompt(dir: &Path, messages: &[Value]) -> Vec<i64> {
    let template = ChatTemplate::from_dir(dir).unwrap();
    let text = template
        .render(ChatInput {
            messages,
            tools: None,
            add_generation_prompt: true,
            extra: None,
        })
        .unwrap();
    Tokenizer::from_dir(dir)
        .unwrap()
        .encode(&text, false)
        .unwrap()
}

pub struct Client {
    pub base: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(server: &Server) -> Self {
        Client {
            base: format!("http://{}", server.addr()),
            http: reqwest::Client::new(),
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, String) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// POSTs and parses the JSON answer.
    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.post(path, body).await;
        let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, value)
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    /// Opens a stream; the events come from [`Stream::next`].
    pub async fn stream(&self, path: &str, body: &Value) -> Stream {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Stream {
            response,
            buffer: String::new(),
            done: false,
        }
    }

    /// The model ids `/v1/models` lists.
    pub async fn model_ids(&self) -> Vec<String> {
        let (status, models) = self.get_json("/v1/models").await;
        assert_eq!(status, 200);
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// An SSE response read event by event.
pub struct Stream {
    response: reqwest::Response,
    buffer: String,
    pub done: bool,
}

impl Stream {
    /// The next `data:` payload as JSON; None after `[DONE]` or at the end of the body.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data = event
                    .trim()
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("{event:?}"));
                if data == "[DONE]" {
                    self.done = true;
                    return None;
                }
                return Some(serde_json::from_str(data).unwrap());
            }
            match self.response.chunk().await.unwrap() {
                Some(bytes) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => return None,
            }
        }
    }

    /// Every remaining payload, checking that the stream ends with `[DONE]`.
    pub async fn all(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        // Bounded by the server's max_tokens: each event is one token or the end.
        while let Some(event) = self.next().await {
            events.push(event);
        }
        assert!(self.done, "the stream ended without [DONE]");
        events
    }
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
