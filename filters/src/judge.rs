//! The judge: an OpenAI-compatible chat completions endpoint that plugins ask through the
//! `judge` import. One prompt, `n` requests sent concurrently (each its own sample, so a plugin
//! can take a majority vote), each with a timeout, at most `max_concurrency` in flight per
//! plugin. An answer that failed is left out and counted, never retried.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::JudgeConfig;
use crate::metrics::{JudgeLabels, Metrics, PluginName};

/// Longest judge answer body read, in bytes.
const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("judge url {url:?} is not a valid URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("judge api_key cannot be sent as a header")]
    BadApiKey,
}

pub struct Judge {
    config: JudgeConfig,
    endpoint: http::Uri,
    auth: Option<HeaderValue>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// Each plugin's own cap on judge requests in flight.
    in_flight: Mutex<HashMap<PluginName, Arc<Semaphore>>>,
    metrics: Metrics,
}

impl Judge {
    pub fn new(config: JudgeConfig, metrics: Metrics) -> Result<Self, JudgeError> {
        let url = format!("{}/chat/completions", config.url.trim_end_matches('/'));
        let endpoint: http::Uri =
            url.parse()
                .map_err(|e: http::uri::InvalidUri| JudgeError::BadUrl {
                    url: config.url.clone(),
                    reason: e.to_string(),
                })?;
        let auth = config
            .api_key
            .as_deref()
            .map(|key| {
                let mut value = HeaderValue::try_from(format!("Bearer {key}"))
                    .map_err(|_| JudgeError::BadApiKey)?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            config,
            endpoint,
            auth,
            client,
            in_flight: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    pub fn budget_per_evaluation(&self) -> u32 {
        self.config.budget_per_evaluation
    }

    fn cap_for(&self, plugin: &PluginName) -> Arc<Semaphore> {
        let mut caps = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            caps.entry(plugin.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(self.config.max_concurrency.max(1)))),
        )
    }

    /// Asks `n` times concurrently; the answers that came back, in the order they finished.
    pub async fn ask(self: &Arc<Self>, plugin: &PluginName, prompt: &str, n: u32) -> Vec<String> {
        let cap = self.cap_for(plugin);
        let body = Bytes::from(
            json!({
                "model": self.config.model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": self.config.temperature,
                "max_tokens": self.config.max_tokens,
            })
            .to_string(),
        );
        let mut asks = JoinSet::new();
        for _ in 0..n {
            let judge = Arc::clone(self);
            let cap = Arc::clone(&cap);
            let body = body.clone();
            asks.spawn(async move {
                let Ok(_permit) = cap.acquire_owned().await else {
                    return Err("closed");
                };
                match tokio::time::timeout(judge.config.timeout, judge.once(body)).await {
                    Ok(result) => result,
                    Err(_) => Err("timeout"),
                }
            });
        }
        let mut answers = Vec::with_capacity(n as usize);
        while let Some(joined) = asks.join_next().await {
            let outcome = match joined {
                Ok(Ok(answer)) => {
                    answers.push(answer);
                    "answered"
                }
                Ok(Err(why)) => why,
                Err(_) => "panicked",
            };
            self.metrics
                .judge_requests
                .get_or_create(&JudgeLabels {
                    plugin: plugin.clone(),
                    outcome,
                })
                .inc();
        }
        answers
    }

    /// One request: the first choice's message content.
    async fn once(&self, body: Bytes) -> Result<String, &'static str> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(auth) = &self.auth {
            request = request.header(header::AUTHORIZATION, auth.clone());
        }
        let request = request.body(Full::new(body)).map_err(|_| "bad_request")?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|_| "unreachable")?;
        if !response.status().is_success() {
            return Err("error_status");
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| "bad_body")?
            .to_bytes();
        let value: Value = serde_json::from_slice(&body).map_err(|_| "bad_body")?;
        value["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_owned)
            .ok_or("no_content")
    }
}
