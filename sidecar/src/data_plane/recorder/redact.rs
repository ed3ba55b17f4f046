//! Redaction rules (regex → replacement) applied to every string of a step before it is stored,
//! so secrets an agent pastes into a conversation never reach the datapool: messages, tool
//! definitions and `tool_choice`, sampling extras (a body's `api_key`), the agent's metadata,
//! the answer's text, reasoning and tool calls, and next states.
//!
//! Token ids are the same text in another alphabet: a secret in the prompt is in
//! `prompt_token_ids`, one in the answer in `completion_token_ids` and the logprobs' tokens. So a
//! step in which any rule matched keeps no engine tokens (`tokens: none`, see
//! [`crate::data_plane::recorder::Recorder::finish`]) rather than store what the rule removed from its text.

use clawback_datapool::{AssistantOutput, StepRequest};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Redaction {
    /// A regular expression (Rust `regex` syntax).
    pub pattern: String,
    /// What each match is replaced with in what is recorded (`$1`, `$name` name the
    /// pattern's groups).
    pub replacement: String,
}

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    rules: Vec<(Regex, String)>,
}

impl Redactor {
    /// Compiles the rules; the config was validated at load, so a bad pattern is reported again
    /// here rather than assumed away.
    pub fn new(rules: &[Redaction]) -> Result<Self, regex::Error> {
        let rules = rules
            .iter()
            .map(|r| Ok((Regex::new(&r.pattern)?, r.replacement.clone())))
            .collect::<Result<_, regex::Error>>()?;
        Ok(Self { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Redacts `text`; true when a rule matched.
    pub fn text(&self, text: &mut String) -> bool {
        let mut matched = false;
        for (pattern, replacement) in &self.rules {
            if let std::borrow::Cow::Owned(replaced) =
                pattern.replace_all(text, replacement.as_str())
            {
                *text = replaced;
                matched = true;
            }
        }
        matched
    }

    /// Every string inside `value`, keys excepted; true when a rule matched.
    pub fn value(&self, value: &mut Value) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        match value {
            Value::String(s) => self.text(s),
            Value::Array(items) => items.iter_mut().fold(false, |m, v| self.value(v) | m),
            Value::Object(map) => map.values_mut().fold(false, |m, v| self.value(v) | m),
            _ => false,
        }
    }

    /// Every text of a step's request; true when a rule matched.
    pub fn request(&self, request: &mut StepRequest) -> bool {
        let mut matched = false;
        for value in request
            .messages
            .iter_mut()
            .chain(request.tools.iter_mut())
            .chain(request.tool_choice.iter_mut())
            .chain(request.sampling.stop.iter_mut())
            .chain(request.sampling.extra.values_mut())
        {
            matched |= self.value(value);
        }
        matched
    }

    /// Every text of an answer; true when a rule matched.
    pub fn output(&self, output: &mut AssistantOutput) -> bool {
        let mut matched = false;
        for text in output
            .content
            .iter_mut()
            .chain(output.reasoning_content.iter_mut())
        {
            matched |= self.text(text);
        }
        for call in &mut output.tool_calls {
            matched |= self.value(call);
        }
        matched
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secrets_are_replaced_everywhere_in_a_message() {
        let redactor = Redactor::new(&[Redaction {
            pattern: r"sk-[A-Za-z0-9]{8,}".to_owned(),
            replacement: "[REDACTED]".to_owned(),
        }])
        .unwrap();
        let mut message = json!({"role": "user", "content": [{"type": "text", "text": "key sk-abcdef123456 ok"}]});
        assert!(redactor.value(&mut message));
        assert_eq!(message["content"][0]["text"], "key [REDACTED] ok");
        assert!(!redactor.value(&mut json!({"content": "nothing secret"})));
    }

    fn redactor() -> Redactor {
        Redactor::new(&[Redaction {
            pattern: r"sk-[A-Za-z0-9]{8,}".to_owned(),
            replacement: "[REDACTED]".to_owned(),
        }])
        .unwrap()
    }

    #[test]
    fn every_field_of_a_request_is_redacted() {
        let secret = "sk-abcdef123456";
        let body = json!({
            "model": "m",
            "messages": [{"role": "user", "content": format!("my key is {secret}")}],
            "tools": [{"type": "function", "function": {"name": "login",
                "description": format!("logs in with {secret}"), "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": secret}},
            "stop": [secret],
            "api_key": secret,
            "min_p": 0.1,
        });
        let messages = body["messages"].as_array().unwrap().clone();
        let mut request = crate::data_plane::recorder::request::step_request(messages, &body);
        assert!(redactor().request(&mut request));
        let stored = serde_json::to_string(&request).unwrap();
        assert!(!stored.contains(secret), "{stored}");
        assert_eq!(stored.matches("[REDACTED]").count(), 5, "{stored}");
    }

    #[test]
    fn every_field_of_an_answer_is_redacted() {
        let secret = "sk-abcdef123456";
        let mut output = AssistantOutput {
            content: Some(format!("use {secret}")),
            reasoning_content: Some(format!("the key {secret} is in the env")),
            tool_calls: vec![json!({"id": "c1", "type": "function",
                "function": {"name": "login", "arguments": format!("{{\"key\":\"{secret}\"}}")}})],
        };
        assert!(redactor().output(&mut output));
        let stored = serde_json::to_string(&output).unwrap();
        assert!(!stored.contains(secret), "{stored}");
        let mut clean = AssistantOutput {
            content: Some("nothing here".to_owned()),
            ..AssistantOutput::default()
        };
        assert!(!redactor().output(&mut clean));
    }
}
