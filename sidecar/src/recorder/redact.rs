//! Redaction rules (regex → replacement) applied to every string of a step before it is stored,
//! so secrets an agent pastes into a conversation never reach the datapool.

use regex::Regex;
use serde_json::Value;

use crate::config::Redaction;

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

    pub fn text(&self, text: &mut String) {
        for (pattern, replacement) in &self.rules {
            if let std::borrow::Cow::Owned(replaced) =
                pattern.replace_all(text, replacement.as_str())
            {
                *text = replaced;
            }
        }
    }

    /// Every string inside `value`, keys excepted.
    pub fn value(&self, value: &mut Value) {
        if self.rules.is_empty() {
            return;
        }
        match value {
            Value::String(s) => self.text(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.value(v)),
            _ => {}
        }
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
        redactor.value(&mut message);
        assert_eq!(message["content"][0]["text"], "key [REDACTED] ok");
    }
}
