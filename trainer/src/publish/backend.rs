//! The calls that load, unload and reload weights in one inference backend, in each engine's
//! own shapes:
//!
//! | | load adapter | unload adapter | reload full weights |
//! |---|---|---|---|
//! | vLLM | `POST /v1/load_lora_adapter {lora_name, lora_path}` | `POST /v1/unload_lora_adapter {lora_name}` | — |
//! | SGLang | `POST /load_lora_adapter {lora_name, lora_path}` | `POST /unload_lora_adapter {lora_name}` | `POST /update_weights_from_disk {model_path, flush_cache, weight_version}` |
//! | reference | as vLLM | as vLLM | as SGLang |
//!
//! vLLM answers a load of a name it already has with 400, and an unload of a name it does not
//! have with 404: after a retried call whose first try did arrive, both mean the work is done,
//! so both count as success. SGLang may answer 200 with `{"success": false, "message"}`: that is
//! a failure.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::config::{Backend, BackendKind};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url} refused: {message}")]
    Refused { url: String, message: String },
}

/// One backend, ready to be called.
#[derive(Debug, Clone)]
pub struct BackendClient {
    http: reqwest::Client,
    kind: BackendKind,
    /// The URL without a trailing `/v1` or `/`.
    root: String,
    api_key: Option<String>,
}

/// What a call is, for telling "already done" apart from a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Load,
    Unload,
    Reload,
}

impl BackendClient {
    pub fn new(backend: &Backend, http: reqwest::Client) -> Self {
        let trimmed = backend.url.trim_end_matches('/');
        let root = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_owned();
        Self {
            http,
            kind: backend.kind,
            root,
            api_key: backend.api_key.clone(),
        }
    }

    /// The backend's URL, for reports.
    pub fn url(&self) -> &str {
        &self.root
    }

    pub async fn load_adapter(&self, name: &str, dir: &Path) -> Result<(), BackendError> {
        let path = match self.kind {
            BackendKind::Vllm | BackendKind::Reference => "/v1/load_lora_adapter",
            BackendKind::Sglang => "/load_lora_adapter",
        };
        let body = json!({"lora_name": name, "lora_path": dir.to_string_lossy()});
        self.post(Op::Load, path, body).await
    }

    pub async fn unload_adapter(&self, name: &str) -> Result<(), BackendError> {
        let path = match self.kind {
            BackendKind::Vllm | BackendKind::Reference => "/v1/unload_lora_adapter",
            BackendKind::Sglang => "/unload_lora_adapter",
        };
        self.post(Op::Unload, path, json!({"lora_name": name}))
            .await
    }

    /// Reloads the whole model from `dir` (SGLang's shape; the config refuses vLLM here).
    pub async fn update_weights(&self, dir: &Path, version: u64) -> Result<(), BackendError> {
        let body = json!({
            "model_path": dir.to_string_lossy(),
            "flush_cache": true,
            "weight_version": format!("v{version}"),
        });
        self.post(Op::Reload, "/update_weights_from_disk", body)
            .await
    }

    async fn post(&self, op: Op, path: &str, body: Value) -> Result<(), BackendError> {
        let url = format!("{}{path}", self.root);
        let mut request = self.http.post(&url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let unreachable = |source| BackendError::Unreachable {
            url: url.clone(),
            source,
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let text = response.text().await.map_err(unreachable)?;
        let already_done = match op {
            Op::Load => status.as_u16() == 400 && text.contains("already been loaded"),
            Op::Unload => status.as_u16() == 404,
            Op::Reload => false,
        };
        if already_done {
            return Ok(());
        }
        if !status.is_success() {
            return Err(BackendError::Status {
                url,
                status: status.as_u16(),
                body: text.chars().take(500).collect(),
            });
        }
        // SGLang reports some failures in a 200 body.
        if let Ok(answer) = serde_json::from_str::<Value>(&text) {
            if answer.get("success") == Some(&Value::Bool(false)) {
                let message = answer
                    .get("message")
                    .or_else(|| answer.get("error_message"))
                    .and_then(Value::as_str)
                    .unwrap_or("no message")
                    .to_owned();
                return Err(BackendError::Refused { url, message });
            }
        }
        Ok(())
    }
}

/// The HTTP client every backend and sidecar call shares.
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder().timeout(timeout).build()
}
