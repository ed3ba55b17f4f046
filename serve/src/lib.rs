//! `clawback-serve`: an OpenAI-compatible reference backend over clawback-model's decoder
//! (the one the trainer trains), for CPU tests and demos. It answers in vLLM's (≈0.11) JSON
//! and SSE shapes — `return_token_ids`, logprobs, usage, tool calls as vLLM's hermes parser
//! returns them — and hot-swaps LoRA adapters (vLLM's endpoints) and full weights (SGLang's),
//! so that the sidecar and the trainer's publishing can be exercised end to end without a GPU
//! engine.
//!
//! | file | job |
//! |---|---|
//! | `http.rs` | accept loop, routes, bodies, error → response |
//! | `chat.rs`, `completions.rs` | the two generation endpoints, whole and streamed |
//! | `admin.rs` | `/v1/models`, adapter load/unload, weight updates |
//! | `protocol.rs` | request bodies and their checks |
//! | `reply.rs` | prompt → worker job → text pieces and finish |
//! | `text.rs` | incremental detokenisation and stop strings |
//! | `tool_calls.rs` | hermes-style `<tool_call>` parsing |
//! | `shapes.rs` | vLLM's response shapes |
//! | `app.rs` | shared state and the client side of the worker |
//! | `engine.rs` | the model worker thread: admission, interleaved decoding, swaps |
//! | `error.rs` | `ServeError` and its HTTP mapping |

mod adapter_roots;
mod admin;
mod app;
mod chat;
mod completions;
mod engine;
mod error;
mod http;
mod protocol;
mod reply;
mod shapes;
mod text;
mod tool_calls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clawback_model::chat_template::ChatTemplate;
use clawback_model::config::ModelConfig;
use clawback_model::model::{Model, ModelError, Placement};
use clawback_model::tokenizer::Tokenizer;

pub use error::ServeError;

/// What to serve and where.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// An HF folder: config.json, safetensors, tokenizer.json, tokenizer_config.json.
    pub model: PathBuf,
    /// The name requests use for the base model; vLLM's default is the path as given.
    pub served_model_name: Option<String>,
    /// LoRA adapters to load at start, by name.
    pub adapters: Vec<(String, PathBuf)>,
    pub placement: Placement,
    /// Sequences decoded at once; later requests wait their turn.
    pub max_num_seqs: usize,
    pub addr: SocketAddr,
    /// vLLM's filesystem LoRA resolver (`VLLM_LORA_RESOLVER_CACHE_DIR`): a request for a model
    /// the server does not know, named like a PEFT folder in this directory, loads that folder
    /// as the adapter first. A restarted server thus serves the adapters published before it.
    pub lora_resolver_dir: Option<PathBuf>,
    /// Folders `/v1/load_lora_adapter` may load from (the resolver directory is one too);
    /// without any, runtime loading is refused.
    pub lora_roots: Vec<PathBuf>,
    /// Adapters loaded at once; a load past it is refused until one is unloaded.
    pub max_loaded_adapters: usize,
}

/// A running server.
pub struct Server {
    listening: http::Listening,
}

impl Server {
    /// Loads the model, starts its worker thread, loads the start-up adapters and listens.
    pub async fn start(options: ServeOptions) -> Result<Server, ServeError> {
        let ServeOptions {
            model,
            served_model_name,
            adapters,
            placement,
            max_num_seqs,
            addr,
            lora_resolver_dir,
            lora_roots,
            max_loaded_adapters,
        } = options;
        let base_name = served_model_name.unwrap_or_else(|| model.display().to_string());
        let dir = model.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let weights_error = |source: ModelError| ServeError::WeightsLoad {
                path: dir.display().to_string(),
                source: Box::new(source),
            };
            let config = ModelConfig::from_dir(&dir).map_err(|e| weights_error(e.into()))?;
            let net = Model::load(&dir, placement).map_err(weights_error)?;
            let tokenizer = Tokenizer::from_dir(&dir)?;
            let template = ChatTemplate::from_dir(&dir)?;
            Ok::<_, ServeError>((config, net, tokenizer, template))
        })
        .await
        .map_err(|e| ServeError::Generation(format!("model loading panicked: {e}")))?;
        let (config, net, tokenizer, template) = loaded?;
        let worker = engine::spawn(net, base_name.clone(), model, max_num_seqs)
            .map_err(|e| ServeError::Generation(format!("cannot start the model thread: {e}")))?;
        let app = Arc::new(app::App::new(
            tokenizer,
            template,
            config,
            base_name,
            placement,
            worker,
            adapter_roots::RuntimeAdapters::new(lora_resolver_dir, lora_roots, max_loaded_adapters),
        ));
        for (name, path) in adapters {
            app.load_adapter(name, path).await?;
        }
        let listening = http::listen(app, addr).await?;
        Ok(Server { listening })
    }

    /// The address it listens on (the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.listening.addr
    }

    /// Stops accepting and closes connections.
    pub fn stop(&self) {
        self.listening.stop();
    }

    /// Waits until the server has stopped.
    pub async fn finished(self) {
        self.listening.finished().await;
    }
}
