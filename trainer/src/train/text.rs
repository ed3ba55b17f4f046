//! The trainer's own ids for what the engine gave none of: text-only steps (an OpenAI upstream)
//! re-tokenised knowingly, and the teacher's hint-augmented prompts for distillation. Both need
//! the base model's `tokenizer.json` and chat template; without them such steps are counted and
//! skipped.

use std::path::Path;

use clawback_datapool::Step;
use serde_json::{json, Value as Json};

use clawback_model::chat_template::{with_hint, ChatInput, ChatTemplate, TemplateError};
use clawback_model::tokenizer::{Tokenizer, TokenizerError};

/// What went wrong turning a step's text into ids.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("the rendered conversation does not start with the rendered prompt")]
    PromptNotPrefix,
    #[error("no user message to append the hint to")]
    NoUserMessage,
    #[error("token id {0} is out of range")]
    BadId(i64),
}

/// The base model's tokenizer and chat template.
#[derive(Debug)]
pub struct TextCodec {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    eos: Option<u32>,
}

impl TextCodec {
    /// Loads both from the model folder; `None` when the folder has no tokenizer or template.
    pub fn load(dir: &Path) -> Option<Self> {
        let tokenizer = Tokenizer::from_dir(dir).ok()?;
        let template = ChatTemplate::from_dir(dir).ok()?;
        let eos = template
            .special_tokens()
            .eos_token
            .as_deref()
            .and_then(|t| tokenizer.token_id(t))
            .and_then(|id| u32::try_from(id).ok());
        Some(TextCodec {
            tokenizer,
            template,
            eos,
        })
    }

    /// The ids of the prompt `messages` render to, generation prompt included.
    pub fn prompt_ids(&self, messages: &[Json], tools: &[Json]) -> Result<Vec<u32>, TextError> {
        let text = self.template.render(ChatInput {
            messages,
            tools: (!tools.is_empty()).then_some(tools),
            add_generation_prompt: true,
            extra: None,
        })?;
        self.encode(&text)
    }

    /// The teacher's context of `step`: its prompt with `hint` appended to the last user message.
    pub fn hinted_prompt_ids(&self, step: &Step, hint: &str) -> Result<Vec<u32>, TextError> {
        let messages = with_hint(&step.request.messages, hint).ok_or(TextError::NoUserMessage)?;
        self.prompt_ids(&messages, &step.request.tools)
    }

    /// A text-only step's prompt and completion ids: the conversation rendered with and without
    /// the assistant's reply, the completion being the difference up to the end-of-turn token.
    pub fn retokenise(&self, step: &Step) -> Result<(Vec<u32>, Vec<u32>), TextError> {
        let prompt = self.prompt_ids(&step.request.messages, &step.request.tools)?;
        let mut reply = json!({"role": "assistant", "content": step.output.content});
        if !step.output.tool_calls.is_empty() {
            reply["tool_calls"] = Json::Array(step.output.tool_calls.clone());
        }
        let mut messages = step.request.messages.clone();
        messages.push(reply);
        let tools = step.request.tools.as_slice();
        let full = self.encode(&self.template.render(ChatInput {
            messages: &messages,
            tools: (!tools.is_empty()).then_some(tools),
            add_generation_prompt: false,
            extra: None,
        })?)?;
        let Some(rest) = full.strip_prefix(prompt.as_slice()) else {
            return Err(TextError::PromptNotPrefix);
        };
        // What follows the end-of-turn token (a newline) is template, not generated.
        let end = self
            .eos
            .and_then(|eos| rest.iter().position(|&id| id == eos))
            .map_or(rest.len(), |at| at + 1);
        Ok((prompt, rest[..end].to_vec()))
    }

    /// The end-of-turn token, where the template names one the tokenizer knows.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The text of generated `ids`, special tokens (the end of turn) left out.
    pub fn reply_text(&self, ids: &[i64]) -> Result<String, TextError> {
        Ok(self.tokenizer.decode(ids, true)?)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.tokenizer
            .encode(text, false)?
            .into_iter()
            .map(|id| u32::try_from(id).map_err(|_| TextError::BadId(id)))
            .collect()
    }
}
