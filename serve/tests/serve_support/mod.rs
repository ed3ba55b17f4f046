//! What the serve tests stand on: tiny random HF model folders written to disk
//! ([`TinyModel`]), PEFT adapters, a server on a loopback port, and a small client
//! that reads SSE streams.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clawback_model::config::ModelConfig;
use clawback_model::lora::LoraConfig;
use clawback_model::model::Placement;
use clawback_model::test_support::random_adapter;
use clawback_model::tiny_model::TinyModel;
pub use clawback_model::tiny_model::EOS_ID;
use clawback_model::{ChatInput, ChatTemplate, Tokenizer};
use clawback_serve::{ServeOptions, Server};
use serde_json::Value;

pub const BASE: &str = "tiny-qwen";

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
    tiny(0, layers).config_json()
}

fn tiny(seed: i64, layers: i64) -> TinyModel {
    TinyModel {
        layers,
        seed,
        ..TinyModel::default()
    }
}

/// Writes a random model folder (weights from `seed`) that `serve --model` can load.
pub fn write_model(dir: &Path, seed: i64, layers: i64) {
    let _rng = torch_rng();
    tiny(seed, layers).write(dir).unwrap();
}

/// Writes a PEFT adapter for the model in `model_dir` whose B factors are random, so that it
/// changes the model's outputs (a fresh adapter's B is zero).
pub fn write_adapter(model_dir: &Path, dir: &Path, seed: i64, rank: i64) {
    let config = ModelConfig::from_dir(model_dir).unwrap();
    let _rng = torch_rng();
    let lora = LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        ..LoraConfig::default()
    };
    let adapter = random_adapter(&config, lora, seed, 0.5);
    adapter.save(dir, Some(BASE)).unwrap();
}

/// A server for the model in `dir`, named [`BASE`], on a free loopback port.
pub async fn start(dir: &Path) -> Server {
    start_with_resolver(dir, None).await
}

/// [`start`], with vLLM's filesystem LoRA resolver reading `resolver`.
pub async fn start_with_resolver(dir: &Path, resolver: Option<PathBuf>) -> Server {
    // Ops this small gain nothing from a second thread.
    tch::set_num_threads(1);
    Server::start(ServeOptions {
        model: dir.to_owned(),
        served_model_name: Some(BASE.to_owned()),
        adapters: Vec::new(),
        placement: Placement::cpu(),
        max_num_seqs: 8,
        addr: "127.0.0.1:0".parse().unwrap(),
        lora_resolver_dir: resolver,
        // The tests write their adapters beside the model.
        lora_roots: vec![dir.to_owned()],
        max_loaded_adapters: 8,
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
            buffer: Vec::new(),
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
    /// Bytes, not text: a body chunk may end inside a multi-byte character.
    buffer: Vec<u8>,
    pub done: bool,
}

impl Stream {
    /// The next `data:` payload as JSON; None after `[DONE]` or at the end of the body.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let event = String::from_utf8(event).expect("an SSE event is UTF-8");
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
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
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
