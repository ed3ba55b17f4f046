//! What a plugin sees: typed views of recorded steps, built from the datapool schema and cut to
//! the size caps documented in the WIT. Raw request bodies never reach a plugin.

use clawback_datapool::{
    AssistantOutput, NextState as RecordedNext, Step as RecordedStep, AGENT_METADATA_KEY,
};
use serde_json::{Map, Value};

use crate::bindings::{Message, MetadataEntry, NextState, Step, ToolCall, ToolResult};

/// Longest text (message content, tool-call arguments, a tool result) a plugin is given.
pub const TEXT_CAP: usize = 16 << 10;
/// Messages of a step's history a plugin is given: the last ones.
pub const HISTORY_CAP: usize = 64;
/// Messages of a next state a plugin is given: the first ones.
pub const NEXT_CAP: usize = 32;
/// Turns of a trajectory a plugin is given: the last ones.
pub const TURNS_CAP: usize = 64;
/// Metadata entries, and the longest value.
pub const METADATA_CAP: usize = 64;
pub const METADATA_VALUE_CAP: usize = 4 << 10;

/// Tracks whether anything was cut.
#[derive(Default)]
struct Cut(bool);

impl Cut {
    fn text(&mut self, text: &str) -> String {
        if text.len() <= TEXT_CAP {
            return text.to_owned();
        }
        self.0 = true;
        truncate(text, TEXT_CAP).to_owned()
    }
}

/// `text` cut to at most `cap` bytes, on a character boundary.
fn truncate(text: &str, cap: usize) -> &str {
    if text.len() <= cap {
        return text;
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The trajectory metadata as plugin entries: JSON strings without quotes, other values as JSON.
/// What the agent's own request body said ([`AGENT_METADATA_KEY`]) is left out for every plugin:
/// the policy being scored must not set its own ground truth.
pub fn metadata(map: &Map<String, Value>) -> Vec<MetadataEntry> {
    map.iter()
        .filter(|(key, _)| key.as_str() != AGENT_METADATA_KEY)
        .take(METADATA_CAP)
        .map(|(key, value)| {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            MetadataEntry {
                key: key.clone(),
                value: truncate(&value, METADATA_VALUE_CAP).to_owned(),
            }
        })
        .collect()
}

/// A recorded step as a plugin sees it.
pub fn step(recorded: &RecordedStep, metadata: Vec<MetadataEntry>) -> Step {
    let mut cut = Cut::default();
    let messages = &recorded.request.messages;
    let skip = messages.len().saturating_sub(HISTORY_CAP);
    cut.0 |= skip > 0;
    let history = messages[skip..]
        .iter()
        .map(|m| message(m, &mut cut))
        .collect();
    let output = assistant(&recorded.output, &mut cut);
    let reasoning = recorded
        .output
        .reasoning_content
        .as_deref()
        .map(|r| cut.text(r));
    Step {
        index: recorded.index,
        messages: history,
        output,
        reasoning,
        finish_reason: recorded.finish_reason.clone(),
        metadata,
        truncated: cut.0,
    }
}

/// A reply to one question, as a step with nothing after it: what a check outside a trajectory
/// (the trainer's gate) gives a plugin.
pub fn reply(question: &str, reply: &str, metadata: Vec<MetadataEntry>) -> (Step, NextState) {
    let mut cut = Cut::default();
    let text = |role: &str, content: &str, cut: &mut Cut| Message {
        role: role.to_owned(),
        content: cut.text(content),
        tool_calls: Vec::new(),
        tool_call_id: None,
        name: None,
    };
    let messages = vec![text("user", question, &mut cut)];
    let output = text("assistant", reply, &mut cut);
    let step = Step {
        index: 0,
        messages,
        output,
        reasoning: None,
        finish_reason: Some("stop".to_owned()),
        metadata,
        truncated: cut.0,
    };
    let next = NextState {
        messages: Vec::new(),
        tool_results: Vec::new(),
        user_message: None,
        truncated: false,
    };
    (step, next)
}

/// What followed a step, with its tool results matched to the step's tool calls.
pub fn next_state(recorded: &RecordedNext, step: &Step) -> NextState {
    let mut cut = Cut::default();
    cut.0 |= recorded.messages.len() > NEXT_CAP;
    let messages: Vec<Message> = recorded
        .messages
        .iter()
        .take(NEXT_CAP)
        .map(|m| message(m, &mut cut))
        .collect();
    let tool_results = messages
        .iter()
        .filter(|m| m.role == "tool")
        .map(|m| {
            let call_id = m.tool_call_id.clone().unwrap_or_default();
            let name = step
                .output
                .tool_calls
                .iter()
                .find(|call| call.id == call_id)
                .map(|call| call.name.clone())
                .or_else(|| m.name.clone());
            ToolResult {
                call_id,
                name,
                content: m.content.clone(),
            }
        })
        .collect();
    let user_message = messages
        .iter()
        .find(|m| m.role == "user")
        .map(|m| m.content.clone());
    NextState {
        messages,
        tool_results,
        user_message,
        truncated: cut.0,
    }
}

fn assistant(output: &AssistantOutput, cut: &mut Cut) -> Message {
    Message {
        role: "assistant".to_owned(),
        content: cut.text(output.content.as_deref().unwrap_or_default()),
        tool_calls: output
            .tool_calls
            .iter()
            .map(|call| tool_call(call, cut))
            .collect(),
        tool_call_id: None,
        name: None,
    }
}

/// A chat message, or a Responses API input item (`message`, `function_call`,
/// `function_call_output`), as a [`Message`].
fn message(value: &Value, cut: &mut Cut) -> Message {
    let str_field = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
    match value.get("type").and_then(Value::as_str) {
        Some("function_call") => Message {
            role: "assistant".to_owned(),
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: str_field("call_id").unwrap_or_default(),
                name: str_field("name").unwrap_or_default(),
                arguments: cut.text(
                    value
                        .get("arguments")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                ),
            }],
            tool_call_id: None,
            name: None,
        },
        Some("function_call_output") => Message {
            role: "tool".to_owned(),
            content: cut.text(&content_text(value.get("output"))),
            tool_calls: Vec::new(),
            tool_call_id: str_field("call_id"),
            name: None,
        },
        _ => Message {
            role: str_field("role").unwrap_or_else(|| "user".to_owned()),
            content: cut.text(&content_text(value.get("content"))),
            tool_calls: value
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| calls.iter().map(|c| tool_call(c, cut)).collect())
                .unwrap_or_default(),
            tool_call_id: str_field("tool_call_id"),
            name: str_field("name"),
        },
    }
}

/// OpenAI `{id, type, function: {name, arguments}}`.
fn tool_call(value: &Value, cut: &mut Cut) -> ToolCall {
    let function = value.get("function");
    let arguments = match function.and_then(|f| f.get("arguments")) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    ToolCall {
        id: value
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        name: function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        arguments: cut.text(&arguments),
    }
}

/// A content field's text: a string, or the text parts of a list joined by newlines.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| match part {
                Value::String(s) => Some(s.as_str()),
                other => other.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_and_responses_messages_become_typed_messages() {
        let mut cut = Cut::default();
        let chat = message(
            &json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"ls\"}"}}
            ]}),
            &mut cut,
        );
        assert_eq!(chat.tool_calls[0].name, "bash");
        assert_eq!(chat.tool_calls[0].arguments, "{\"cmd\":\"ls\"}");
        let parts = message(
            &json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            &mut cut,
        );
        assert_eq!(parts.content, "a\nb");
        let output = message(
            &json!({"type": "function_call_output", "call_id": "c9", "output": "sunny"}),
            &mut cut,
        );
        assert_eq!(
            (output.role.as_str(), output.tool_call_id.as_deref()),
            ("tool", Some("c9"))
        );
        assert!(!cut.0);
    }

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let mut cut = Cut::default();
        let long = "é".repeat(TEXT_CAP);
        let text = cut.text(&long);
        assert!(text.len() <= TEXT_CAP && cut.0);
        assert!(text.chars().all(|c| c == 'é'));
    }
}
