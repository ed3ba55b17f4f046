//! One exported row per trainable step, and the rules that give it a reward and a hint. The
//! format is documented for trainers in `sidecar/EXPORT.md`; this file is its one definition.

use clawback_datapool::{
    Evaluation, EvaluationSource, Step, StepId, Tokens, TrajectoryRecord, Verdict,
};
use serde::Serialize;
use serde_json::{json, Map, Value};

/// A trainable step as trainers read it. JSON-valued fields stay JSON in JSONL and become JSON
/// strings in Parquet, so both keep the OpenAI message shapes exactly as recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub tenant: String,
    pub trajectory_id: String,
    pub group_id: Option<String>,
    pub step_id: String,
    pub step_index: u32,
    /// TRL's conversational prompt: the request's messages (the same value as `messages`).
    pub prompt: Value,
    /// TRL's conversational completion: a list holding the one assistant message.
    pub completion: Value,
    /// The request's messages, verbatim OpenAI JSON.
    pub messages: Value,
    /// The request's tools (an empty list when it had none).
    pub tools: Value,
    pub prompt_token_ids: Vec<u32>,
    pub completion_token_ids: Vec<u32>,
    pub completion_logprobs: Vec<f32>,
    /// Over `prompt_token_ids ++ completion_token_ids`: 0 on the prompt, 1 on what the model
    /// sampled. Empty when the step has no engine ids (`tokens_source: "none"`).
    pub loss_mask: Vec<u8>,
    /// `"engine"` (ids exactly as the engine sampled them) or `"none"` (text only: re-tokenise).
    pub tokens_source: &'static str,
    pub reward: Option<f64>,
    /// Which rule gave `reward`: `"feedback"`, `"plugin"`, `"trajectory"`, or null.
    pub reward_source: Option<&'static str>,
    pub hint: Option<String>,
    /// What followed the step (tool results, the user's reply); null for the last step.
    pub next_state: Option<Value>,
    pub finish_reason: Option<String>,
    pub policy_adapter: Option<String>,
    pub policy_version: Option<u64>,
    pub model: String,
}

/// The rows of a trajectory: one per trainable step, in step order. Side turns (recorded but
/// marked not-for-training) are left out; the second value counts them.
pub fn rows(record: &TrajectoryRecord) -> (Vec<Row>, usize) {
    let trajectory_reward = reward_of(&record.evaluations, None).map(|(r, _)| r);
    let mut rows = Vec::with_capacity(record.steps.len());
    let mut side_turns = 0;
    for step in &record.steps {
        if !step.trainable {
            side_turns += 1;
            continue;
        }
        rows.push(row(record, step, trajectory_reward));
    }
    (rows, side_turns)
}

fn row(record: &TrajectoryRecord, step: &Step, trajectory_reward: Option<f64>) -> Row {
    let (reward, reward_source) = match reward_of(&record.evaluations, Some(&step.id)) {
        Some((reward, source)) => (Some(reward), Some(source)),
        None => match trajectory_reward {
            Some(reward) => (Some(reward), Some("trajectory")),
            None => (None, None),
        },
    };
    let (prompt_token_ids, completion_token_ids, completion_logprobs, loss_mask, tokens_source) =
        match &step.tokens {
            Tokens::Engine(t) => {
                let mask = std::iter::repeat_n(0, t.prompt_token_ids.len())
                    .chain(std::iter::repeat_n(1, t.completion_token_ids.len()))
                    .collect();
                (
                    t.prompt_token_ids.clone(),
                    t.completion_token_ids.clone(),
                    // Training arithmetic is f32; logprobs need no more.
                    t.completion_logprobs
                        .iter()
                        .map(|l| l.logprob as f32)
                        .collect(),
                    mask,
                    "engine",
                )
            }
            Tokens::None => (Vec::new(), Vec::new(), Vec::new(), Vec::new(), "none"),
        };
    let messages = Value::Array(step.request.messages.clone());
    Row {
        tenant: step.tenant.to_string(),
        trajectory_id: step.trajectory.to_string(),
        group_id: record.trajectory.group.map(|g| g.id.to_string()),
        step_id: step.id.to_string(),
        step_index: step.index,
        prompt: messages.clone(),
        completion: json!([assistant_message(step)]),
        messages,
        tools: Value::Array(step.request.tools.clone()),
        prompt_token_ids,
        completion_token_ids,
        completion_logprobs,
        loss_mask,
        tokens_source,
        reward,
        reward_source,
        hint: hint_of(&record.evaluations, &step.id),
        next_state: step
            .next_state
            .as_ref()
            .map(|n| Value::Array(n.messages.clone())),
        finish_reason: step.finish_reason.clone(),
        policy_adapter: step.policy.as_ref().map(|p| p.adapter.clone()),
        policy_version: step.policy.as_ref().map(|p| p.version),
        model: step.upstream.model.clone(),
    }
}

/// The step's output as the OpenAI assistant message the agent received; `content` stays
/// present (null for a pure tool call) as chat templates expect.
fn assistant_message(step: &Step) -> Value {
    let out = &step.output;
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert("content".into(), json!(out.content));
    if let Some(reasoning) = &out.reasoning_content {
        message.insert("reasoning_content".into(), json!(reasoning));
    }
    if !out.tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(out.tool_calls.clone()));
    }
    Value::Object(message)
}

/// The reward of one step (`Some(id)`) or of the whole trajectory (`None`), from the
/// evaluations aimed exactly at it. Explicit feedback is a person's word and outranks plugins:
/// the latest feedback reward wins (a thumb can be flipped). Without feedback, plugin rewards
/// are averaged, so two filters scoring the same step weigh equally. Filter errors and
/// hint-only evaluations carry no reward.
fn reward_of(evaluations: &[Evaluation], step: Option<&StepId>) -> Option<(f64, &'static str)> {
    let mut feedback: Option<(&Evaluation, f64)> = None;
    let (mut plugin_sum, mut plugin_count) = (0.0, 0u32);
    for e in evaluations.iter().filter(|e| e.step.as_ref() == step) {
        let Verdict::Score {
            reward: Some(reward),
            ..
        } = e.verdict
        else {
            continue;
        };
        match e.source {
            // `>=`: of two with the same time, the one appended later is the later word.
            EvaluationSource::Feedback { .. } => {
                if feedback.is_none_or(|(f, _)| e.created_at >= f.created_at) {
                    feedback = Some((e, reward));
                }
            }
            EvaluationSource::Plugin { .. } => {
                plugin_sum += reward;
                plugin_count += 1;
            }
        }
    }
    match feedback {
        Some((_, reward)) => Some((reward, "feedback")),
        None if plugin_count > 0 => Some((plugin_sum / f64::from(plugin_count), "plugin")),
        None => None,
    }
}

/// The longest hint aimed at the step: the most specific direction wins, and the choice does
/// not depend on the order filters happened to finish in.
fn hint_of(evaluations: &[Evaluation], step: &StepId) -> Option<String> {
    evaluations
        .iter()
        .filter(|e| e.step.as_ref() == Some(step))
        .filter_map(|e| match &e.verdict {
            Verdict::Score { hint: Some(h), .. } if !h.trim().is_empty() => Some(h),
            _ => None,
        })
        .max_by_key(|h| h.chars().count())
        .cloned()
}

#[cfg(test)]
mod tests {
    use clawback_datapool::example::tool_use_trajectory;
    use clawback_datapool::{EvaluationId, TenantId, UnixMs};

    use super::*;

    fn example() -> TrajectoryRecord {
        tool_use_trajectory(TenantId::new("acme").unwrap_or_else(|e| panic!("{e}")))
    }

    fn score(
        record: &TrajectoryRecord,
        step: Option<usize>,
        source: EvaluationSource,
        reward: Option<f64>,
        hint: Option<&str>,
        at: u64,
    ) -> Evaluation {
        Evaluation {
            id: EvaluationId::new(),
            step: step.map(|i| record.steps[i].id),
            source,
            verdict: Verdict::Score {
                reward,
                hint: hint.map(str::to_owned),
            },
            created_at: UnixMs(at),
            ..record.evaluations[0].clone()
        }
    }

    fn plugin() -> EvaluationSource {
        EvaluationSource::Plugin {
            name: "p".into(),
            content_hash: "sha256:00".into(),
        }
    }

    fn thumb() -> EvaluationSource {
        EvaluationSource::Feedback {
            channel: "ui".into(),
        }
    }

    #[test]
    fn the_example_gives_a_plugin_reward_then_the_trajectory_reward_and_the_hint() {
        let (rows, side) = rows(&example());
        assert_eq!(side, 0);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].reward, Some(1.0));
        assert_eq!(rows[0].reward_source, Some("plugin"));
        assert_eq!(rows[0].hint, None);
        // Step 1 has only a hint: the handshake's trajectory reward applies.
        assert_eq!(rows[1].reward, Some(1.0));
        assert_eq!(rows[1].reward_source, Some("trajectory"));
        assert!(rows[1]
            .hint
            .as_deref()
            .is_some_and(|h| h.contains("umbrella")));
        for row in &rows {
            let ids = row.prompt_token_ids.len() + row.completion_token_ids.len();
            assert_eq!(row.loss_mask.len(), ids);
            assert_eq!(
                row.completion_logprobs.len(),
                row.completion_token_ids.len()
            );
            assert_eq!(row.prompt, row.messages);
        }
    }

    #[test]
    fn the_latest_feedback_outranks_plugins_and_plugins_are_averaged() {
        let mut record = example();
        let late_thumb = score(&record, Some(0), thumb(), Some(-1.0), None, 10);
        let early_thumb = score(&record, Some(0), thumb(), Some(1.0), None, 5);
        let half = score(&record, Some(1), plugin(), Some(0.5), None, 1);
        let zero = score(&record, Some(1), plugin(), Some(0.0), None, 2);
        record
            .evaluations
            .extend([late_thumb, early_thumb, half, zero]);
        let (rows, _) = rows(&record);
        assert_eq!(rows[0].reward, Some(-1.0));
        assert_eq!(rows[0].reward_source, Some("feedback"));
        assert_eq!(rows[1].reward, Some(0.25));
        assert_eq!(rows[1].reward_source, Some("plugin"));
    }

    #[test]
    fn filter_errors_carry_no_reward_and_no_evaluation_means_null() {
        let mut record = example();
        let mut failed = score(&record, Some(0), plugin(), None, None, 1);
        failed.verdict = Verdict::FilterError {
            reason: "trap".into(),
        };
        record.evaluations = vec![failed];
        let (rows, _) = rows(&record);
        assert_eq!(rows[0].reward, None);
        assert_eq!(rows[0].reward_source, None);
    }

    #[test]
    fn the_longest_hint_of_the_step_is_kept() {
        let mut record = example();
        let short = score(&record, Some(0), plugin(), None, Some("be brief"), 1);
        let long = score(
            &record,
            Some(0),
            plugin(),
            None,
            Some("call the tool once"),
            2,
        );
        let other_step = score(
            &record,
            Some(1),
            plugin(),
            None,
            Some("x".repeat(99).as_str()),
            3,
        );
        record.evaluations.extend([short, long, other_step]);
        let (rows, _) = rows(&record);
        assert_eq!(rows[0].hint.as_deref(), Some("call the tool once"));
    }

    #[test]
    fn a_text_only_step_has_no_ids_and_an_empty_mask_and_side_turns_are_left_out() {
        let mut record = example();
        record.steps[0].trainable = false;
        record.steps[1].tokens = Tokens::None;
        let (rows, side) = rows(&record);
        assert_eq!(side, 1);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].tokens_source, "none");
        assert!(rows[0].loss_mask.is_empty());
        assert!(rows[0].prompt_token_ids.is_empty());
    }

    #[test]
    fn the_completion_is_one_assistant_message_with_reasoning_and_tool_calls() {
        let (rows, _) = rows(&example());
        let message = &rows[0].completion[0];
        assert_eq!(message["role"], json!("assistant"));
        assert_eq!(message["content"], Value::Null);
        assert_eq!(
            message["tool_calls"][0]["function"]["name"],
            json!("get_weather")
        );
        assert!(message["reasoning_content"].is_string());
        assert_eq!(rows[1].completion[0].get("tool_calls"), None);
    }
}
