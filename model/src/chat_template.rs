//! Renders a model's chat template (Jinja, from `tokenizer_config.json` or
//! `chat_template.jinja`) the way transformers' `apply_chat_template` does, so that the
//! prompts we re-tokenise and the hint-augmented teacher contexts match what the model saw.
//!
//! transformers renders with `trim_blocks` and `lstrip_blocks`, the loop-controls extension,
//! a `raise_exception` global, a `tojson` that is Python's `json.dumps`, and the tokenizer's
//! special tokens as variables; Python string and dict methods (`.strip()`,
//! `.startswith()`, `.items()`) come from minijinja-contrib's pycompat.

use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::Value as Json;

use crate::json_file::{self, JsonFileError};
use crate::pyjson::{self, DumpOptions};

const TEMPLATE_NAME: &str = "chat";

/// What went wrong finding, compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    ConfigFile(#[from] JsonFileError),
    #[error("{0} has no chat template (neither a chat_template field nor chat_template.jinja)")]
    NoTemplate(String),
    #[error("the chat template does not compile: {0}")]
    Compile(#[source] Error),
    #[error("rendering the chat template failed: {0:#}")]
    Render(#[source] Error),
}

/// Special-token strings that templates refer to by name (`bos_token`, `eos_token`, ...).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpecialTokens {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bos_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unk_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad_token: Option<String>,
}

impl SpecialTokens {
    /// Reads the tokens from a parsed `tokenizer_config.json`, where each is either a string
    /// or an AddedToken object with a `content` field.
    pub fn from_tokenizer_config(config: &Json) -> Self {
        let token = |key: &str| match config.get(key)? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content")?.as_str().map(str::to_owned),
            _ => None,
        };
        SpecialTokens {
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
            unk_token: token("unk_token"),
            pad_token: token("pad_token"),
        }
    }
}

/// One render: the conversation, the tools offered, and whether to open the assistant's turn.
#[derive(Debug, Clone, Copy)]
pub struct ChatInput<'a> {
    /// OpenAI-shaped messages (`role`, `content`, `tool_calls`, `tool_call_id`, ...).
    pub messages: &'a [Json],
    /// OpenAI-shaped tool definitions (`{"type": "function", "function": {...}}`).
    pub tools: Option<&'a [Json]>,
    pub add_generation_prompt: bool,
    /// Further template variables, as `apply_chat_template(**kwargs)` passes them
    /// (e.g. Qwen3's `enable_thinking`).
    pub extra: Option<&'a serde_json::Map<String, Json>>,
}

/// A compiled chat template, ready to render conversations.
pub struct ChatTemplate {
    env: Environment<'static>,
    special: SpecialTokens,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("special", &self.special)
            .finish()
    }
}

impl ChatTemplate {
    /// Loads the template of a model folder: `chat_template.jinja` when present (newer
    /// transformers write it there), else `tokenizer_config.json`'s `chat_template`. Named
    /// templates (a list of `{name, template}`) use the `default` one.
    pub fn from_dir(dir: &Path) -> Result<Self, TemplateError> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = if config_path.exists() {
            json_file::read(&config_path)?
        } else {
            Json::Null
        };
        let special = SpecialTokens::from_tokenizer_config(&config);
        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.exists() {
            read(&jinja_path)?
        } else {
            match config.get("chat_template") {
                Some(Json::String(s)) => s.clone(),
                Some(Json::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str())
                    .map(str::to_owned)
                    .ok_or_else(|| TemplateError::NoTemplate(config_path.display().to_string()))?,
                _ => return Err(TemplateError::NoTemplate(dir.display().to_string())),
            }
        };
        Self::new(source, special)
    }

    /// Compiles a template's source.
    pub fn new(source: String, special: SpecialTokens) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(TemplateError::Compile)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(TemplateError::Compile)?;
        Ok(ChatTemplate { env, special })
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The prompt text for `input`.
    pub fn render(&self, input: ChatInput<'_>) -> Result<String, TemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(TemplateError::Render)?;
        // Later sources win, as in transformers: special tokens, then kwargs, then the call's own.
        let mut ctx = match serde_json::to_value(&self.special) {
            Ok(Json::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        if let Some(extra) = input.extra {
            ctx.extend(extra.clone());
        }
        ctx.insert("messages".to_owned(), Json::Array(input.messages.to_vec()));
        let tools = input.tools.map_or(Json::Null, |t| Json::Array(t.to_vec()));
        ctx.insert("tools".to_owned(), tools);
        ctx.insert("documents".to_owned(), Json::Null);
        ctx.insert(
            "add_generation_prompt".to_owned(),
            Json::Bool(input.add_generation_prompt),
        );
        let ctx = Value::from(Serde(ctx));
        template.render(ctx).map_err(TemplateError::Render)
    }
}

/// The teacher's context for hint-guided distillation: the same conversation with the
/// hint appended to the last user message (DESIGN.md "Losses"). None when there is no
/// user message with text content to append to.
pub fn with_hint(messages: &[Json], hint: &str) -> Option<Vec<Json>> {
    let mut messages = messages.to_vec();
    let last_user = messages
        .iter_mut()
        .rev()
        .find(|m| m.get("role").and_then(Json::as_str) == Some("user"))?;
    match last_user.get_mut("content")? {
        Json::String(text) => {
            text.push_str("\n\n");
            text.push_str(hint);
        }
        // Content parts: the hint becomes one more text part.
        Json::Array(parts) => parts.push(serde_json::json!({"type": "text", "text": hint})),
        _ => return None,
    }
    Some(messages)
}

fn read(path: &Path) -> Result<String, TemplateError> {
    std::fs::read_to_string(path).map_err(|source| TemplateError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(usize::try_from(v)?),
        }),
    };
    let mut options = match indent {
        Some(indent) => DumpOptions::with_indent(indent),
        None => DumpOptions::default(),
    };
    if let Some(separators) = kwargs.get::<Option<Value>>("separators")? {
        if !separators.is_none() {
            let parts: Vec<Value> = separators.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] => {
                    options.item_separator = item.to_string();
                    options.key_separator = key.to_string();
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson separators must be a pair",
                    ))
                }
            }
        }
    }
    if let Some(ensure_ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        options.ensure_ascii = ensure_ascii;
    }
    if let Some(sort_keys) = kwargs.get::<Option<bool>>("sort_keys")? {
        options.sort_keys = sort_keys;
    }
    kwargs.assert_all_used()?;
    // Safe: the text goes into a prompt, not into HTML.
    Ok(Value::from_safe_string(pyjson::dumps(value, &options)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(source: &str, messages: Json, tools: Option<Json>) -> String {
        let t = ChatTemplate::new(source.to_owned(), SpecialTokens::default()).unwrap();
        let messages = messages.as_array().unwrap().clone();
        let tools = tools.map(|t| t.as_array().unwrap().clone());
        t.render(ChatInput {
            messages: &messages,
            tools: tools.as_deref(),
            add_generation_prompt: true,
            extra: None,
        })
        .unwrap()
    }

    #[test]
    fn block_lines_vanish_like_in_transformers() {
        let source = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}>{% endif %}";
        let out = render(source, json!([{"role": "user", "content": "hi"}]), None);
        assert_eq!(out, "[hi]\n>");
    }

    #[test]
    fn tojson_prints_tool_arguments_as_python_does() {
        let source = "{% for t in tools %}{{ t | tojson }}{% endfor %}|{{ messages[0].tool_calls[0].function.arguments | tojson }}";
        let out = render(
            source,
            json!([{"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "f", "arguments": {"q": "<a&b>", "n": 1.0}}}]}]),
            Some(json!([{"type": "function", "function": {"name": "f", "parameters": {}}}])),
        );
        assert_eq!(
            out,
            r#"{"type": "function", "function": {"name": "f", "parameters": {}}}|{"q": "<a&b>", "n": 1.0}"#
        );
    }

    #[test]
    fn python_string_methods_and_loop_controls_work() {
        let source = "{% for m in messages %}{% if m.content.startswith('skip') %}{% continue %}{% endif %}{{ m.content.strip() }};{% endfor %}";
        let out = render(
            source,
            json!([{"role": "user", "content": "skip me"}, {"role": "user", "content": "  kept \n"}]),
            None,
        );
        assert_eq!(out, "kept;");
    }

    #[test]
    fn raise_exception_fails_the_render_with_its_message() {
        let t = ChatTemplate::new(
            "{{ raise_exception('Conversation roles must alternate') }}".to_owned(),
            SpecialTokens::default(),
        )
        .unwrap();
        let err = t
            .render(ChatInput {
                messages: &[],
                tools: None,
                add_generation_prompt: false,
                extra: None,
            })
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("Conversation roles must alternate"),
            "{err}"
        );
    }

    #[test]
    fn special_tokens_are_template_variables() {
        let config = json!({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"});
        let t = ChatTemplate::new(
            "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".to_owned(),
            SpecialTokens::from_tokenizer_config(&config),
        )
        .unwrap();
        let messages = [json!({"role": "user", "content": "x"})];
        let out = t
            .render(ChatInput {
                messages: &messages,
                tools: None,
                add_generation_prompt: false,
                extra: None,
            })
            .unwrap();
        assert_eq!(out, "<s>x</s>");
    }

    #[test]
    fn the_hint_is_appended_to_the_last_user_message_only() {
        let messages = vec![
            json!({"role": "user", "content": "first"}),
            json!({"role": "assistant", "content": "a"}),
            json!({"role": "user", "content": "second"}),
            json!({"role": "tool", "content": "result"}),
        ];
        let hinted = with_hint(&messages, "Check the units.").unwrap();
        assert_eq!(hinted[0]["content"], "first");
        assert_eq!(hinted[2]["content"], "second\n\nCheck the units.");
        assert_eq!(hinted[3], messages[3]);
        assert!(with_hint(&[json!({"role": "system", "content": "s"})], "h").is_none());
    }
}
