//! One chat completion as the simulated agents and users make it: the OpenAI API through a
//! sidecar, with the tenant's API key, the model by its base name (the sidecar routes it to the
//! tenant's live adapter).

use std::time::Duration;

use serde_json::{json, Value};

use crate::BASE_MODEL;

/// Tokens per reply of the tiny model: a short phrase and its end.
pub const MAX_TOKENS: u32 = 20;

/// How a call is sampled. The trainer scores each token under the sampler that drew it (it is
/// recorded with the step).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Sampling {
    pub max_tokens: u32,
    pub temperature: f64,
    pub top_p: f64,
}

impl Sampling {
    /// The tiny model's users and probes: a tiny byte-level model sampled at temperature 1
    /// strays from its phrases every few letters; a cooler, truncated sampler answers with what
    /// it learned, as a served model does with its generation defaults.
    pub const TINY: Sampling = Sampling {
        max_tokens: MAX_TOKENS,
        temperature: 0.6,
        top_p: 0.9,
    };
}

/// How the simulated users and agents talk to the model: the system message every conversation
/// opens with (none: the model's chat template has its own default) and how its replies are
/// sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Talk {
    pub system: Option<&'static str>,
    pub sampling: Sampling,
}

impl Talk {
    /// A conversation's first messages: the system message, if any, and `question`.
    pub fn opening(&self, question: &str) -> Vec<Value> {
        let mut messages: Vec<Value> = self
            .system
            .map(|system| json!({"role": "system", "content": system}))
            .into_iter()
            .collect();
        messages.push(json!({"role": "user", "content": question}));
        messages
    }
}

/// What the engine answered.
#[derive(Debug, Clone)]
pub struct Reply {
    pub content: String,
    /// The model that answered: the tenant's adapter (`tenant@v7`) or the base model.
    pub model: String,
}

impl Reply {
    /// The adapter version that answered; 0 for the base model.
    pub fn version(&self) -> u64 {
        self.model
            .rsplit_once("@v")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    }
}

/// The version that answered most of a probing's calls (the newer one on a tie), from how many
/// each answered; 0 (the base model) when none did.
pub fn most_common_version(answered: std::collections::BTreeMap<u64, usize>) -> u64 {
    answered
        .into_iter()
        .max_by_key(|&(version, count)| (count, version))
        .map_or(0, |(version, _)| version)
}

/// `POST {base_url}/chat/completions` (an OpenAI base URL, `http://sidecar/v1`) with
/// `messages`, sampled as `sampling` says, and `headers`; the error as the caller saw it.
pub async fn complete(
    client: &reqwest::Client,
    base_url: &str,
    key: &str,
    messages: &[Value],
    sampling: Sampling,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let mut request = client
        .post(format!("{base_url}/chat/completions"))
        .bearer_auth(key)
        .timeout(Duration::from_secs(600))
        .json(&json!({
            "model": BASE_MODEL,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = success_body(request, "chat completion").await?;
    let answer: Value =
        serde_json::from_str(&body).map_err(|e| format!("chat completion: {e}: {body}"))?;
    let content = answer["choices"][0]["message"]["content"]
        .as_str()
        .ok_or_else(|| format!("chat completion without content: {body}"))?;
    Ok(Reply {
        content: content.to_owned(),
        model: answer["model"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Sends `request` and reads its body, which must come with a success status; the error names
/// `what` was asked (`chat completion: HTTP 429 Too Many Requests: {...}`).
pub async fn success_body(request: reqwest::RequestBuilder, what: &str) -> Result<String, String> {
    let response = request.send().await.map_err(|e| format!("{what}: {e}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|e| format!("{what} body: {e}"))?;
    if !status.is_success() {
        return Err(format!("{what}: HTTP {status}: {body}"));
    }
    Ok(body)
}
