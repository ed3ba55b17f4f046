//! The request bodies `serve` accepts, as vLLM's OpenAI-compatible server reads them, and
//! their checks: sampling fields, token options, `n`. Unknown fields are ignored, as vLLM
//! ignores them.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::ServeError;

/// vLLM's limit on `top_logprobs` (its default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The sampling fields chat and text completions share.
#[derive(Debug, Clone, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<usize>,
    pub stop: Option<Stop>,
    pub seed: Option<u64>,
    pub n: Option<u64>,
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: Option<bool>,
    #[serde(default)]
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// POST /v1/chat/completions.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    #[serde(default)]
    pub return_token_ids: bool,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default = "yes")]
    pub add_generation_prompt: bool,
}

/// `prompt` of a text completion: text or token ids, one prompt only.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<i64>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<i64>>),
}

/// POST /v1/completions.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// How many alternatives to report per token (an integer here, unlike chat; vLLM takes
    /// `true` as 1 and `false` as none).
    pub logprobs: Option<LogprobsCount>,
    #[serde(default)]
    pub echo: bool,
    #[serde(default)]
    pub return_token_ids: bool,
}

/// A completions `logprobs`: a count, or a boolean as vLLM's pydantic model coerces it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum LogprobsCount {
    Count(usize),
    Flag(bool),
}

impl LogprobsCount {
    pub fn count(self) -> Option<usize> {
        match self {
            Self::Count(k) => Some(k),
            Self::Flag(true) => Some(1),
            Self::Flag(false) => None,
        }
    }
}

/// POST /v1/load_lora_adapter.
#[derive(Debug, Clone, Deserialize)]
pub struct LoadAdapter {
    pub lora_name: Option<String>,
    pub lora_path: Option<String>,
}

/// POST /v1/unload_lora_adapter.
#[derive(Debug, Clone, Deserialize)]
pub struct UnloadAdapter {
    pub lora_name: Option<String>,
}

/// POST /update_weights_from_disk (SGLang).
#[derive(Debug, Clone, Deserialize)]
pub struct UpdateWeights {
    pub model_path: Option<String>,
}

fn yes() -> bool {
    true
}

/// The numeric fields of the sampling settings: checked on the raw body first, because serde
/// loses the path inside the flattened [`SamplingFields`].
const NUMBERS: [&str; 9] = [
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
];

/// A body parsed into `T`, or the 400 vLLM's request validation gives (`"type": "Bad
/// Request"`, `param` naming the field as pydantic does: `body.<field>`).
pub fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ServeError> {
    if let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) {
        let wrong = NUMBERS.iter().find_map(|k| {
            fields
                .get(*k)
                .filter(|v| !v.is_number() && !v.is_null())
                .map(|v| (*k, v))
        });
        if let Some((key, value)) = wrong {
            return Err(ServeError::Invalid {
                message: format!("invalid request body: `{key}` must be a number, got {value}"),
                field: Some(format!("body.{key}")),
            });
        }
    }
    let mut json = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        ServeError::Invalid {
            message: format!("invalid request body: {}", e.inner()),
            field: (path != ".").then(|| format!("body.{path}")),
        }
    })
}

/// The sampling settings of a request once checked, before its prompt length is known.
#[derive(Debug, Clone)]
pub struct Checked {
    pub temperature: f64,
    pub top_p: f64,
    pub seed: Option<u64>,
    pub max_tokens: Option<usize>,
    pub stops: Vec<String>,
    pub include_stop: bool,
    pub skip_special_tokens: bool,
    pub ignore_eos: bool,
}

impl SamplingFields {
    /// Checks the fields as vLLM does, and refuses `n > 1`, which this server does not do.
    pub fn check(&self, max_tokens: Option<usize>) -> Result<Checked, ServeError> {
        let bad = |m: String| Err(ServeError::BadRequest(m));
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return bad(format!(
                "n = {n} is not supported: clawback-serve generates one choice per \
                 request (send {n} requests instead)"
            ));
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if temperature.is_nan() || temperature < 0.0 {
            return bad(format!(
                "temperature must be non-negative, got {temperature}."
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if top_p.is_nan() || top_p <= 0.0 || top_p > 1.0 {
            return bad(format!("top_p must be in (0, 1], got {top_p}."));
        }
        if max_tokens == Some(0) {
            return bad("max_tokens must be at least 1, got 0.".to_owned());
        }
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        Ok(Checked {
            temperature,
            top_p,
            seed: self.seed,
            max_tokens,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            include_stop: self.include_stop_str_in_output,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            ignore_eos: self.ignore_eos,
        })
    }
}

impl ChatRequest {
    /// How many alternatives to report per token (0 when logprobs are off).
    pub fn top_logprobs(&self) -> Result<usize, ServeError> {
        match self.top_logprobs {
            Some(k) if k > 0 && !self.logprobs => Err(ServeError::BadRequest(
                "when using `top_logprobs`, `logprobs` must be set to true.".to_owned(),
            )),
            Some(k) if k > MAX_TOP_LOGPROBS => Err(ServeError::BadRequest(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {k}."
            ))),
            Some(k) => Ok(k),
            None => Ok(0),
        }
    }

    /// Whether the reply is read for `<tool_call>` markup: tools offered and not switched off.
    pub fn parses_tool_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.is_empty())
            && self.tool_choice.as_ref().and_then(Value::as_str) != Some("none")
    }
}

impl CompletionRequest {
    pub fn top_logprobs(&self) -> Result<usize, ServeError> {
        match self.logprobs.and_then(LogprobsCount::count) {
            Some(k) if k > MAX_TOP_LOGPROBS => Err(ServeError::BadRequest(format!(
                "logprobs must be at most {MAX_TOP_LOGPROBS}, got {k}."
            ))),
            Some(k) => Ok(k),
            None => Ok(0),
        }
    }
}

impl StreamOptions {
    pub fn wants_usage(options: &Option<StreamOptions>) -> bool {
        options.as_ref().is_some_and(|o| o.include_usage)
    }
}
