//! Tool calls in the model's text, read the way vLLM's `hermes` parser reads them: Qwen and
//! Hermes models write `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the client
//! gets OpenAI `tool_calls` with the arguments re-serialised as Python's `json.dumps`
//! (`ensure_ascii=False`), and the text before the first call as `content`.

use serde_json::Value;

use clawback_model::pyjson::{self, DumpOptions};

pub const START: &str = "<tool_call>";
pub const END: &str = "</tool_call>";

/// One function call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object as a JSON string.
    pub arguments: String,
}

/// A reply that called tools: the text before the first call (None when empty) and the calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCalls {
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

/// The tool calls in `text`, or None when it has none or one of them is not valid JSON with
/// a `name` (then, as in vLLM, the whole text is the answer).
pub fn parse(text: &str) -> Option<ToolCalls> {
    let first = text.find(START)?;
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(at) = rest.find(START) {
        let body = &rest[at + START.len()..];
        let (json, after) = match body.find(END) {
            Some(end) => (&body[..end], &body[end + END.len()..]),
            None => (body, ""),
        };
        calls.push(call(json)?);
        rest = after;
    }
    let content = &text[..first];
    Some(ToolCalls {
        content: (!content.is_empty()).then(|| content.to_owned()),
        calls,
    })
}

fn call(json: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(json.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = value.get("arguments").cloned().unwrap_or(Value::Null);
    let arguments = pyjson::dumps(
        &minijinja::Value::from(minijinja::value::Serde(arguments)),
        &DumpOptions::default(),
    )
    .ok()?;
    Some(ToolCall { name, arguments })
}

/// How many bytes at the end of `text` could be the beginning of a tool call's start tag, so
/// that a stream holds them back until it knows.
pub fn partial_start_len(text: &str) -> usize {
    (1..START.len())
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len().saturating_sub(n)) && text.ends_with(&START[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qwen_tool_call_becomes_an_openai_call_with_python_spelled_arguments() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                    {\"city\":\"Zürich\",\"days\":[1,2]}}\n</tool_call>";
        let parsed = parse(text).unwrap();
        assert_eq!(parsed.content.as_deref(), Some("Let me check.\n"));
        assert_eq!(
            parsed.calls,
            vec![ToolCall {
                name: "get_weather".to_owned(),
                arguments: r#"{"city": "Zürich", "days": [1, 2]}"#.to_owned(),
            }]
        );
    }

    #[test]
    fn two_calls_and_an_unclosed_last_one_are_all_read() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\
                    <tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}";
        let parsed = parse(text).unwrap();
        assert_eq!(parsed.content, None);
        let names: Vec<&str> = parsed.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(parsed.calls[1].arguments, r#"{"x": 1}"#);
    }

    #[test]
    fn text_without_markup_or_with_broken_json_is_no_tool_call() {
        assert_eq!(parse("just text"), None);
        assert_eq!(parse("<tool_call>{\"name\": \"a\", oops</tool_call>"), None);
    }

    #[test]
    fn a_stream_holds_back_what_may_start_a_tag() {
        assert_eq!(partial_start_len("hello <tool"), 5);
        assert_eq!(partial_start_len("hello <"), 1);
        assert_eq!(partial_start_len("hello"), 0);
        assert_eq!(partial_start_len("é"), 0);
    }
}
