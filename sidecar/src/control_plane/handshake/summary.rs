//! What the viewer's list shows of a trajectory beside its header — the conversation's first
//! user message, how many steps it has, its rewards — and whether it matches an operator's
//! search: read from the trajectory's record.

use clawback_datapool::{TrajectoryRecord, Verdict};
use serde::Serialize;
use serde_json::Value;

/// Characters of the first user message a listing carries.
const FIRST_MESSAGE_CHARS: usize = 200;

#[derive(Debug, Serialize, PartialEq)]
pub struct Summary {
    /// The text of the first `user` message of the first step, cut at
    /// [`FIRST_MESSAGE_CHARS`] characters (with `…`).
    pub first_user_message: Option<String>,
    pub steps: usize,
    /// The mean of the trajectory's scored rewards (plugins' and feedback's), if any.
    pub reward: Option<f64>,
    /// How many rewards the mean is over.
    pub rewards: usize,
}

impl Summary {
    pub fn of(record: &TrajectoryRecord) -> Self {
        let first_user_message = record
            .steps
            .iter()
            .min_by_key(|s| s.index)
            .and_then(|step| {
                step.request
                    .messages
                    .iter()
                    .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            })
            .map(message_text)
            .map(|text| cut(&text));
        let scores: Vec<f64> = record
            .evaluations
            .iter()
            .filter_map(|e| match e.verdict {
                Verdict::Score {
                    reward: Some(reward),
                    ..
                } => Some(reward),
                _ => None,
            })
            .collect();
        let reward = (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64);
        Self {
            first_user_message,
            steps: record.steps.len(),
            reward,
            rewards: scores.len(),
        }
    }
}

/// A search as the operator typed it: words that must all occur, in any case, somewhere in the
/// conversation — its messages, the model's replies, its tool calls — or in the trajectory's id.
#[derive(Debug, Clone)]
pub struct Search {
    words: Vec<String>,
}

impl Search {
    /// `None` for a query with no words.
    pub fn new(query: &str) -> Option<Self> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        (!words.is_empty()).then_some(Self { words })
    }

    pub fn matches(&self, record: &TrajectoryRecord) -> bool {
        let mut text = record.trajectory.id.to_string();
        for step in &record.steps {
            for message in &step.request.messages {
                strings_into(message, &mut text);
            }
            if let Some(content) = &step.output.content {
                text.push('\n');
                text.push_str(content);
            }
            for call in &step.output.tool_calls {
                strings_into(call, &mut text);
            }
        }
        let text = text.to_lowercase();
        self.words.iter().all(|word| text.contains(word.as_str()))
    }
}

/// A message's text: its `content` as a string, or its text parts joined.
fn message_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Every string in a JSON value, appended to `out` one per line.
fn strings_into(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => {
            out.push('\n');
            out.push_str(s);
        }
        Value::Array(items) => items.iter().for_each(|v| strings_into(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings_into(v, out)),
        _ => {}
    }
}

fn cut(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.char_indices().nth(FIRST_MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> TrajectoryRecord {
        let tenant = clawback_datapool::TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        clawback_datapool::example::tool_use_trajectory(tenant)
    }

    #[test]
    fn the_summary_names_the_first_user_message_the_steps_and_the_mean_reward() {
        let record = example();
        let summary = Summary::of(&record);
        assert_eq!(summary.steps, record.steps.len());
        let first = summary.first_user_message.clone().unwrap_or_default();
        assert!(!first.is_empty(), "{summary:?}");
        assert!(
            record.steps[0]
                .request
                .messages
                .iter()
                .any(|m| message_text(m) == first),
            "{first:?}"
        );
        assert_eq!(summary.reward.is_some(), summary.rewards > 0);
    }

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let long = "é".repeat(FIRST_MESSAGE_CHARS + 10);
        let cut = cut(&long);
        assert_eq!(cut.chars().count(), FIRST_MESSAGE_CHARS + 1);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn a_search_matches_every_word_anywhere_in_the_conversation_in_any_case() {
        let record = example();
        let first = Summary::of(&record).first_user_message.unwrap_or_default();
        let word = first
            .split_whitespace()
            .max_by_key(|w| w.len())
            .unwrap_or_default()
            .to_uppercase();
        let search = |q: &str| Search::new(q).is_some_and(|s| s.matches(&record));
        assert!(search(&word), "{word}");
        assert!(search(&record.trajectory.id.to_string()[..8]));
        assert!(!search(&format!("{word} zebra-quokka")));
        assert!(Search::new("   ").is_none());
    }
}
