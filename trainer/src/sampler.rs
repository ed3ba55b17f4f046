//! The distribution the engine drew each token from, so that the trainer scores tokens under
//! the policy that sampled them.
//!
//! An engine does not sample from the model's softmax: it applies penalties, divides by the
//! temperature and truncates (min-p, top-k, top-p) first. vLLM's `--logprobs-mode
//! processed_logprobs` reports the log-probability of each sampled token under that processed
//! distribution; its default, `raw_logprobs`, reports the softmax before any of it. When a
//! request sets no sampling parameter, vLLM takes the model folder's `generation_config.json`
//! (`--generation-config auto`; Qwen2.5's: temperature 0.7, top-p 0.8, top-k 20, repetition
//! penalty 1.05).
//!
//! **What the trainer does.** Each step's [`Sampler`] is resolved from what its request set,
//! else the engine's defaults ([`EngineDefaults`]), else vLLM's neutral values. The trainer
//! then turns its own logits into the same processed distribution, in vLLM's order
//! (`vllm/v1/sample/sampler.py`): penalties on the logits (repetition over prompt and output so
//! far, frequency and presence over output so far), temperature, min-p, top-k, then top-p. The
//! policy being trained is the deployed one, model and sampler together:
//! - temperature and penalties are differentiable maps of the logits and stay in the gradient;
//! - truncation is a mask computed from the current policy's own logits (no gradient through the
//!   mask, as in the engine): a token the current policy would no longer keep has probability 0
//!   under it. Such a token is counted and leaves the loss (its ratio is 0, its gradient 0, and
//!   a KL term on it is undefined). Its own logit is left in place so that nothing computed for
//!   it is infinite;
//! - a greedy call (temperature 0) has no stochastic policy; vLLM's processed logprobs for it
//!   are the penalised softmax at temperature 1 with no truncation, and that is how it is scored
//!   (and counted, so a deployment training on greedy calls can see it).
//!
//! Recorded logprobs are used as the behaviour policy only when they describe this
//! distribution: the engine ran `processed_logprobs`, or the sampler is neutral (raw equals
//! processed). Otherwise the span's behaviour comes from the current policy under the sampler
//! (ratio 1 at the first update), and the step is counted.
//!
//! **What the trainer does not reproduce**: logits processors that mask or shift tokens —
//! `logit_bias`, `allowed_token_ids`, `bad_words`, `min_tokens`, structured outputs
//! (`structured_outputs`, `guided_*`, a JSON `response_format` or Responses `text.format`, and
//! the forced tool call of a `tool_choice` that is `"required"` or names a function). A step that used one ([`unmodelled`]) has its behaviour
//! from the current policy too, and is counted.

use std::path::Path;

use clawback_datapool::{SamplingParams, StepRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::{Kind, Tensor};

/// vLLM's `_SAMPLING_EPS`: a temperature below it is greedy.
const SAMPLING_EPS: f64 = 1e-5;

/// The logit given to a token that truncation removed: finite, so that `p · log p` is 0 and no
/// NaN reaches the entropy or a gradient, yet far below any real logit (its probability is 0 in
/// f32).
const REMOVED: f64 = -1e9;

/// A span's logits turned into those of the distribution the engine sampled from.
#[derive(Debug)]
pub struct Processed {
    /// `[n, vocab]`: `log_softmax` gives the engine's processed logprobs of every row whose
    /// target it kept. Tokens truncation removed get a far-negative constant — except each row's
    /// own target, left as it is so that its log-prob stays finite.
    pub logits: Tensor,
    /// `[n]` f32: 1 where the row's target is in the truncated support, 0 where the current
    /// policy would not sample it (the row leaves the loss).
    pub kept: Tensor,
}

/// What the engine's logprobs are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogprobsMode {
    /// vLLM's default (`raw_logprobs`): the softmax of the model's logits, before penalties,
    /// temperature and truncation.
    #[default]
    Raw,
    /// vLLM `--logprobs-mode processed_logprobs`: under the distribution the token was drawn
    /// from.
    Processed,
}

/// The engine's values for the knobs a request leaves unset (vLLM: `--generation-config`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

/// Why the engine's defaults could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: `{key}` is {value}, which is not a valid {key}")]
    Value {
        path: String,
        key: &'static str,
        value: Value,
    },
}

impl EngineDefaults {
    /// vLLM's own defaults (`--generation-config vllm`): nothing beyond neutral.
    pub const NONE: EngineDefaults = EngineDefaults {
        temperature: None,
        top_p: None,
        top_k: None,
        min_p: None,
        repetition_penalty: None,
    };

    /// The defaults in words, for the trainer's start line.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                parts.push(format!("{name} {v}"));
            }
        };
        add("temperature", self.temperature.map(|v| v.to_string()));
        add("top_p", self.top_p.map(|v| v.to_string()));
        add("top_k", self.top_k.map(|v| v.to_string()));
        add("min_p", self.min_p.map(|v| v.to_string()));
        add(
            "repetition_penalty",
            self.repetition_penalty.map(|v| v.to_string()),
        );
        if parts.is_empty() {
            "none (neutral)".into()
        } else {
            parts.join(", ")
        }
    }

    /// The sampling fields of `<model>/generation_config.json`, as vLLM reads them with
    /// `--generation-config auto` (its `get_diff_sampling_param`); no file means no defaults.
    pub fn from_model_dir(model: &Path) -> Result<Self, SamplerError> {
        let path = model.join("generation_config.json");
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::NONE),
            Err(source) => {
                return Err(SamplerError::Read {
                    path: shown,
                    source,
                })
            }
        };
        let json: Value = serde_json::from_str(&text).map_err(|source| SamplerError::Json {
            path: shown.clone(),
            source,
        })?;
        let number = |key: &'static str| -> Result<Option<f64>, SamplerError> {
            match json.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .map(Some)
                    .ok_or_else(|| SamplerError::Value {
                        path: shown.clone(),
                        key,
                        value: v.clone(),
                    }),
            }
        };
        let top_k = match json.get("top_k") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().ok_or_else(|| SamplerError::Value {
                path: shown.clone(),
                key: "top_k",
                value: v.clone(),
            })?),
        };
        Ok(EngineDefaults {
            temperature: number("temperature")?,
            top_p: number("top_p")?,
            top_k,
            min_p: number("min_p")?,
            repetition_penalty: number("repetition_penalty")?,
        })
    }
}

/// The first knob of `request` that changed the engine's distribution in a way this module
/// does not reproduce (see the module docs), by its request name.
pub fn unmodelled(request: &StepRequest) -> Option<&'static str> {
    const MASKING: [&str; 8] = [
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ];
    let extra = &request.sampling.extra;
    let set = |v: &Value| match v {
        Value::Null | Value::Bool(false) => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    };
    if let Some(key) = MASKING.iter().find(|k| extra.get(**k).is_some_and(set)) {
        return Some(key);
    }
    if extra
        .get("min_tokens")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 0)
    {
        return Some("min_tokens");
    }
    // A JSON format is a grammar the engine masks every step with.
    let constrained = |format: &Value| {
        matches!(
            format["type"].as_str(),
            Some("json_object" | "json_schema" | "structural_tag")
        )
    };
    if extra.get("response_format").is_some_and(constrained) {
        return Some("response_format");
    }
    if extra
        .get("text")
        .and_then(|t| t.get("format"))
        .is_some_and(constrained)
    {
        return Some("text.format");
    }
    match &request.tool_choice {
        Some(Value::String(s)) if s == "required" => Some("tool_choice"),
        Some(Value::Object(_)) => Some("tool_choice"),
        _ => None,
    }
}

/// Every knob of one call's sampling, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampler {
    pub temperature: f64,
    /// `None`: no top-k (vLLM's 0 or −1).
    pub top_k: Option<u32>,
    pub top_p: f64,
    pub min_p: f64,
    pub repetition_penalty: f64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::NEUTRAL
    }
}

impl Sampler {
    /// The model's own softmax: what raw logprobs describe.
    pub const NEUTRAL: Sampler = Sampler {
        temperature: 1.0,
        top_k: None,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    };

    /// What was in force for a call whose request set `requested`: the request's value, else
    /// the engine's default, else neutral. `repetition_penalty` and `min_p` are vLLM extras and
    /// arrive in `requested.extra`.
    pub fn resolve(requested: &SamplingParams, defaults: &EngineDefaults) -> Sampler {
        let extra = |key: &str| requested.extra.get(key).and_then(Value::as_f64);
        let temperature = requested
            .temperature
            .or(defaults.temperature)
            .unwrap_or(1.0);
        let top_k = requested
            .top_k
            .or(defaults.top_k)
            .and_then(|k| u32::try_from(k).ok())
            .filter(|&k| k > 0);
        Sampler {
            temperature: temperature.max(0.0),
            top_k,
            top_p: requested
                .top_p
                .or(defaults.top_p)
                .unwrap_or(1.0)
                .clamp(0.0, 1.0),
            min_p: extra("min_p")
                .or(defaults.min_p)
                .unwrap_or(0.0)
                .clamp(0.0, 1.0),
            // vLLM refuses a penalty that is not positive; a recorded one is treated as none.
            repetition_penalty: extra("repetition_penalty")
                .or(defaults.repetition_penalty)
                .filter(|r| r.is_finite() && *r > 0.0)
                .unwrap_or(1.0),
            presence_penalty: requested.presence_penalty.unwrap_or(0.0),
            frequency_penalty: requested.frequency_penalty.unwrap_or(0.0),
        }
    }

    /// Temperature 0: the engine took the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature < SAMPLING_EPS
    }

    /// The distribution the engine's processed logprobs describe: for a greedy call, the
    /// penalised softmax at temperature 1 without truncation (vLLM's greedy path).
    pub fn scored(&self) -> Sampler {
        if self.is_greedy() {
            Sampler {
                temperature: 1.0,
                top_k: None,
                top_p: 1.0,
                min_p: 0.0,
                ..*self
            }
        } else {
            *self
        }
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    fn truncates(&self) -> bool {
        self.top_k.is_some() || self.top_p < 1.0 || self.min_p > 0.0
    }

    /// Whether the scored distribution is the model's own softmax (raw and processed logprobs
    /// agree).
    pub fn is_neutral(&self) -> bool {
        let s = self.scored();
        s.temperature == 1.0 && !s.truncates() && !s.has_penalties()
    }

    /// Whether recorded logprobs of `mode` describe the scored distribution.
    pub fn logprobs_describe_it(&self, mode: LogprobsMode) -> bool {
        mode == LogprobsMode::Processed || self.is_neutral()
    }

    /// The scored distribution of a span (see [`Processed`]). `logits` is `[n, vocab]`, row `j`
    /// predicting `completion[j]` after `context` and `completion[..j]` (`context`: every token
    /// before the step's completion, what the engine's repetition penalty calls the prompt).
    /// Differentiable through penalties and temperature.
    pub fn apply(&self, logits: &Tensor, context: &[i64], completion: &[i64]) -> Processed {
        let s = self.scored();
        let (n, vocab) = logits.size2().unwrap_or((0, 0));
        let device = logits.device();
        let all_kept = || Tensor::ones([n], (Kind::Float, device));
        if s.is_neutral() {
            return Processed {
                logits: logits.shallow_clone(),
                kept: all_kept(),
            };
        }
        let mut out = logits.to_kind(Kind::Float);
        if s.has_penalties() && n > 0 {
            out = s.penalise(&out, context, completion, vocab, device);
        }
        if s.temperature != 1.0 {
            out = out.divide_scalar(s.temperature);
        }
        let mut kept = all_kept();
        if s.truncates() && n > 0 {
            let (removed, target_kept) = tch::no_grad(|| {
                let removed = s.removed(&out.detach());
                let targets = Tensor::from_slice(&completion[..n as usize])
                    .to_device(device)
                    .unsqueeze(-1);
                let target_removed = removed.gather(-1, &targets, false).squeeze_dim(-1);
                let is_target = Tensor::zeros_like(&removed).scatter_value(-1, &targets, 1);
                (
                    removed.logical_and(&is_target.logical_not()),
                    target_removed.logical_not().to_kind(Kind::Float),
                )
            });
            out = out.masked_fill(&removed, REMOVED);
            kept = target_kept;
        }
        Processed { logits: out, kept }
    }

    /// vLLM's `apply_penalties`: repetition over context and output so far, frequency and
    /// presence over output so far, each row seeing the completion tokens before it.
    fn penalise(
        &self,
        logits: &Tensor,
        context: &[i64],
        completion: &[i64],
        vocab: i64,
        device: tch::Device,
    ) -> Tensor {
        let n = logits.size()[0];
        let (factor, subtract) = tch::no_grad(|| {
            let ids = Tensor::from_slice(&completion[..n as usize]).to_device(device);
            let one_hot = ids.one_hot(vocab).to_kind(Kind::Float);
            // Row j counts completion[..j]: an exclusive running sum.
            let counts = one_hot.cumsum(0, Kind::Float) - &one_hot;
            let in_output = counts.gt(0.0);
            let in_context = if context.is_empty() {
                Tensor::zeros([vocab], (Kind::Bool, device))
            } else {
                Tensor::from_slice(context)
                    .to_device(device)
                    .one_hot(vocab)
                    .sum_dim_intlist(0, false, Kind::Float)
                    .gt(0.0)
            };
            let seen = in_output.logical_or(&in_context.unsqueeze(0));
            let rp = self.repetition_penalty;
            let positive = logits.detach().gt(0.0);
            let scale = positive
                .to_kind(Kind::Float)
                .multiply_scalar(1.0 / rp - rp)
                .g_add_scalar(rp);
            let factor = scale.where_self(&seen, &Tensor::ones_like(&scale));
            let subtract = counts * self.frequency_penalty
                + in_output.to_kind(Kind::Float) * self.presence_penalty;
            (factor, subtract)
        });
        logits * factor - subtract
    }

    /// Which tokens min-p, top-k and top-p remove, on tempered logits (vLLM's
    /// `MinPLogitsProcessor`, then `apply_top_k_top_p`: top-k first, top-p on what it kept,
    /// the most likely token always kept).
    fn removed(&self, logits: &Tensor) -> Tensor {
        let mut removed = Tensor::zeros_like(logits).to_kind(Kind::Bool);
        if self.min_p > 0.0 {
            let probs = logits.softmax(-1, Kind::Float);
            let (top, _) = probs.max_dim(-1, true);
            removed = removed.logical_or(&probs.lt_tensor(&(top * self.min_p)));
        }
        let vocab = logits.size().last().copied().unwrap_or(0);
        let mut kept = logits.masked_fill(&removed, f64::NEG_INFINITY);
        if let Some(k) = self.top_k.map(i64::from).filter(|&k| k < vocab) {
            let (values, _) = kept.topk(k, -1, true, true);
            let kth = values.narrow(-1, k - 1, 1);
            let below = kept.lt_tensor(&kth);
            removed = removed.logical_or(&below);
            kept = kept.masked_fill(&below, f64::NEG_INFINITY);
        }
        if self.top_p < 1.0 {
            let (sorted, order) = kept.sort(-1, false);
            let cumulative = sorted.softmax(-1, Kind::Float).cumsum(-1, Kind::Float);
            let cut = cumulative.le(1.0 - self.top_p);
            // The most likely token stays whatever p is.
            let _ = cut.narrow(-1, vocab - 1, 1).fill_(0);
            let cut = Tensor::zeros_like(&cut).scatter(-1, &order, &cut);
            removed = removed.logical_or(&cut);
        }
        removed
    }

    /// The scored distribution's log-probability of each `completion[j]` (see
    /// [`Sampler::apply`]) and whether it is in the support (`[n]` each).
    pub fn token_logprobs(
        &self,
        logits: &Tensor,
        context: &[i64],
        completion: &[i64],
    ) -> (Tensor, Tensor) {
        let n = logits.size()[0];
        let targets = Tensor::from_slice(&completion[..n as usize]).to_device(logits.device());
        let processed = self.apply(logits, context, completion);
        let logprobs = processed
            .logits
            .log_softmax(-1, Kind::Float)
            .gather(-1, &targets.unsqueeze(-1), false)
            .squeeze_dim(-1);
        (logprobs, processed.kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn logprobs(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(&t.to_kind(Kind::Double)).unwrap()
    }

    fn requested(json: Value) -> SamplingParams {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_request_wins_then_the_engine_default_then_neutral() {
        let defaults = EngineDefaults {
            temperature: Some(0.7),
            top_p: Some(0.8),
            top_k: Some(20),
            min_p: None,
            repetition_penalty: Some(1.05),
        };
        let unset = Sampler::resolve(&SamplingParams::default(), &defaults);
        assert_eq!(unset.temperature, 0.7);
        assert_eq!(unset.top_k, Some(20));
        assert_eq!(unset.top_p, 0.8);
        assert_eq!(unset.repetition_penalty, 1.05);
        let set = Sampler::resolve(
            &requested(json!({"temperature": 1.0, "top_k": -1,
                              "extra": {"repetition_penalty": 1.0, "min_p": 0.1}})),
            &defaults,
        );
        assert_eq!(set.temperature, 1.0);
        assert_eq!(set.top_k, None, "-1 turns top-k off");
        assert_eq!(
            set.top_p, 0.8,
            "what the request left unset comes from the engine"
        );
        assert_eq!(set.min_p, 0.1);
        assert!(!set.is_neutral());
        let neutral = Sampler::resolve(&SamplingParams::default(), &EngineDefaults::NONE);
        assert!(neutral.is_neutral());
        assert!(neutral.logprobs_describe_it(LogprobsMode::Raw));
        assert!(!unset.logprobs_describe_it(LogprobsMode::Raw));
        assert!(unset.logprobs_describe_it(LogprobsMode::Processed));
    }

    #[test]
    fn masking_processors_and_forced_tool_calls_are_named_as_not_reproduced() {
        let with = |body: Value| -> StepRequest { serde_json::from_value(body).unwrap() };
        assert_eq!(unmodelled(&with(json!({"messages": []}))), None);
        assert_eq!(
            unmodelled(&with(json!({"messages": [],
                                    "sampling": {"extra": {"logit_bias": {"42": -100}}}}))),
            Some("logit_bias")
        );
        assert_eq!(
            unmodelled(&with(
                json!({"messages": [], "sampling": {"extra": {"min_tokens": 0}}})
            )),
            None
        );
        assert_eq!(
            unmodelled(&with(
                json!({"messages": [], "sampling": {"extra": {"min_tokens": 4}}})
            )),
            Some("min_tokens")
        );
        assert_eq!(
            unmodelled(&with(json!({"messages": [], "tool_choice": "required"}))),
            Some("tool_choice")
        );
        assert_eq!(
            unmodelled(&with(json!({"messages": [], "tool_choice": "auto"}))),
            None
        );
        let format = |f: Value| with(json!({"messages": [], "sampling": {"extra": f}}));
        assert_eq!(
            unmodelled(&format(json!({"response_format": {"type": "json_object"}}))),
            Some("response_format")
        );
        assert_eq!(
            unmodelled(&format(json!({"response_format": {"type": "text"}}))),
            None
        );
        assert_eq!(
            unmodelled(&format(
                json!({"text": {"format": {"type": "json_schema"}}})
            )),
            Some("text.format")
        );
    }

    #[test]
    fn generation_config_is_read_as_vllm_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            EngineDefaults::from_model_dir(dir.path()).unwrap(),
            EngineDefaults::NONE
        );
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"bos_token_id": 1, "do_sample": true, "eos_token_id": [2, 3],
                "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20, "top_p": 0.8}"#,
        )
        .unwrap();
        let d = EngineDefaults::from_model_dir(dir.path()).unwrap();
        assert_eq!(d.temperature, Some(0.7));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.repetition_penalty, Some(1.05));
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"temperature": "hot"}"#,
        )
        .unwrap();
        let e = EngineDefaults::from_model_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("`temperature` is \"hot\""), "{e}");
    }

    #[test]
    fn temperature_and_truncation_give_the_renormalised_tempered_softmax() {
        // Probabilities at T=0.5 of logits [2, 1, 0, -1] ∝ e^4, e^2, 1, e^-2.
        let logits = Tensor::from_slice(&[2.0f32, 1.0, 0.0, -1.0]).unsqueeze(0);
        let t = |sampler: Sampler, token: i64| {
            logprobs(&sampler.token_logprobs(&logits, &[], &[token]).0)[0]
        };
        let kept = |sampler: Sampler, token: i64| {
            logprobs(&sampler.token_logprobs(&logits, &[], &[token]).1)[0] == 1.0
        };
        let half = Sampler {
            temperature: 0.5,
            ..Sampler::NEUTRAL
        };
        let z: f64 = [4.0f64, 2.0, 0.0, -2.0].iter().map(|x| x.exp()).sum();
        assert!((t(half, 1) - (2.0 - z.ln())).abs() < 1e-5);
        // top-k 2 keeps tokens 0 and 1, renormalised.
        let top2 = Sampler {
            top_k: Some(2),
            ..half
        };
        let z2 = 4f64.exp() + 2f64.exp();
        assert!((t(top2, 1) - (2.0 - z2.ln())).abs() < 1e-5);
        assert!(kept(top2, 1) && !kept(top2, 2));
        assert!(
            t(top2, 2).is_finite(),
            "a removed target keeps a finite log-prob"
        );
        // top-p 0.8 at T=0.5: p0 ≈ 0.867 alone reaches it.
        let top_p = Sampler { top_p: 0.8, ..half };
        assert!(t(top_p, 0).abs() < 1e-5);
        assert!(!kept(top_p, 1));
        // min-p 0.1: p2/p0 = e^-4 < 0.1 goes, p1/p0 = e^-2 ≈ 0.135 stays.
        let min_p = Sampler { min_p: 0.1, ..half };
        assert!((t(min_p, 1) - (2.0 - z2.ln())).abs() < 1e-5);
        assert!(!kept(min_p, 2));
        // Greedy is scored at temperature 1 without truncation.
        let greedy = Sampler {
            temperature: 0.0,
            top_k: Some(1),
            ..Sampler::NEUTRAL
        };
        let z1: f64 = [2.0f64, 1.0, 0.0, -1.0].iter().map(|x| x.exp()).sum();
        assert!((t(greedy, 3) - (-1.0 - z1.ln())).abs() < 1e-5);
    }

    #[test]
    fn penalties_see_the_context_and_the_output_before_each_token() {
        // Two rows over a vocabulary of 3; context [0], completion [1, 1].
        let logits = Tensor::from_slice(&[1.0f32, 2.0, -1.0, 1.0, 2.0, -1.0]).view([2, 3]);
        let sampler = Sampler {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..Sampler::NEUTRAL
        };
        let processed = sampler.apply(&logits, &[0], &[1, 1]);
        let rows = logprobs(&processed.logits.view([-1]));
        // Row 0: token 0 seen in the context (positive: halved); nothing output yet.
        assert_eq!(&rows[..3], &[0.5, 2.0, -1.0]);
        // Row 1: token 1 was output once: halved, then −0.5 (frequency) −0.25 (presence).
        assert_eq!(&rows[3..], &[0.5, 0.25, -1.0]);
    }

    #[test]
    fn the_gradient_flows_through_temperature_and_penalties_not_the_mask() {
        let logits = Tensor::from_slice(&[2.0f32, 1.0, 0.0, -1.0])
            .unsqueeze(0)
            .set_requires_grad(true);
        let sampler = Sampler {
            temperature: 0.7,
            top_k: Some(3),
            repetition_penalty: 1.1,
            ..Sampler::NEUTRAL
        };
        let (lp, _) = sampler.token_logprobs(&logits, &[1], &[0]);
        lp.sum(Kind::Float).backward();
        let grad = logprobs(&logits.grad().view([-1]));
        assert!(grad.iter().all(|g| g.is_finite()));
        assert_eq!(grad[3], 0.0, "a removed token gets no gradient");
        assert!(grad[0] > 0.0 && grad[1] < 0.0);
    }
}
