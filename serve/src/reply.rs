//! The part of a completion that chat and text completions share: turning a checked request
//! and its prompt ids into the worker's job, and turning the worker's events back into
//! text pieces with their tokens and, at the end, a finish reason.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::app::App;
use super::engine::{Event, SampledToken, Sampling};
use super::error::ServeError;
use super::protocol::Checked;
use super::shapes;
use super::text::{Piece, TextStream};

/// Why a reply ended: `finish_reason` and `stop_reason` as vLLM reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: &'static str,
    /// The stop string that ended the reply, null otherwise.
    pub stop_reason: Value,
}

/// A running generation: its prompt, and the worker's events as text pieces.
pub struct Generation {
    pub prompt: Vec<i64>,
    events: UnboundedReceiver<Event>,
    done: bool,
}

/// What one event added: the token (none for the closing event), the text that became
/// visible, and the finish once the reply is over.
#[derive(Debug, Clone)]
pub struct Update {
    pub token: Option<SampledToken>,
    pub text: String,
    pub finish: Option<Finish>,
}

/// Sends the prompt to the worker with the request's sampling settings, after vLLM's
/// context-length check. `prompt_kind` names the prompt in that check's message.
pub async fn start(
    app: &Arc<App>,
    model: Option<String>,
    prompt: Vec<i64>,
    checked: &Checked,
    top_logprobs: usize,
    prompt_kind: &str,
) -> Result<Generation, ServeError> {
    let max_len = usize::try_from(app.config.max_position_embeddings).unwrap_or(usize::MAX);
    if prompt.is_empty() {
        return Err(ServeError::BadRequest("The prompt is empty.".to_owned()));
    }
    if let Some(asked) = checked.max_tokens.filter(|&n| n > max_len) {
        return Err(ServeError::MaxTokensTooLarge {
            key: "max_tokens",
            asked,
            max_len,
        });
    }
    let room = max_len.saturating_sub(prompt.len());
    let max_tokens = checked.max_tokens.unwrap_or(room);
    // `max_tokens` comes from the request: near usize::MAX the sum would wrap and pass.
    if max_tokens > room || room == 0 {
        return Err(ServeError::BadRequest(format!(
            "This model's maximum context length is {max_len} tokens. However, you requested \
             {} tokens ({} in the {prompt_kind}, {max_tokens} in the completion). Please reduce \
             the length of the {prompt_kind} or completion.",
            prompt.len().saturating_add(max_tokens),
            prompt.len()
        )));
    }
    let vocab = app.config.vocab_size;
    if let Some(&id) = prompt.iter().find(|&&id| id < 0 || id >= vocab) {
        return Err(ServeError::BadRequest(format!(
            "Token id {id} is out of vocabulary (size {vocab})."
        )));
    }
    let sampling = Sampling {
        temperature: checked.temperature,
        top_p: checked.top_p,
        seed: checked.seed.unwrap_or_else(|| app.random_seed()),
        max_tokens,
        stop_token_ids: if checked.ignore_eos {
            Vec::new()
        } else {
            app.stop_token_ids.clone()
        },
        top_logprobs,
    };
    let model = model.unwrap_or_else(|| app.base_name.clone());
    let events = app.generate(model, prompt.clone(), sampling).await?;
    Ok(Generation {
        prompt,
        events,
        done: false,
    })
}

impl Generation {
    /// The next update, None after the one that finished the reply.
    pub async fn next(&mut self, text: &mut TextStream<'_>) -> Result<Option<Update>, ServeError> {
        if self.done {
            return Ok(None);
        }
        let event = self.events.recv().await.ok_or(ServeError::WorkerGone)?;
        let update = match event {
            Event::Token(token) => match text.push(token.id)? {
                Piece::Text(piece) => Update {
                    token: Some(token),
                    text: piece,
                    finish: None,
                },
                Piece::Stopped { text, stop } => Update {
                    token: Some(token),
                    text,
                    finish: Some(Finish {
                        reason: "stop",
                        stop_reason: Value::String(stop),
                    }),
                },
            },
            Event::Finished(reason) => Update {
                token: None,
                text: text.finish()?,
                finish: Some(Finish {
                    reason: shapes::finish_reason(reason),
                    stop_reason: Value::Null,
                }),
            },
            Event::Failed(message) => return Err(ServeError::Generation(message)),
        };
        // Ending here drops the receiver on return, which stops the worker's sequence too.
        self.done = update.finish.is_some();
        if self.done {
            self.events.close();
        }
        Ok(Some(update))
    }

    /// Runs the generation to its end: every token, the whole text, and the finish.
    pub async fn collect(
        &mut self,
        text: &mut TextStream<'_>,
    ) -> Result<(Vec<SampledToken>, String, Finish), ServeError> {
        let mut tokens = Vec::new();
        let mut all = String::new();
        // Bounded: the worker sends at most max_tokens tokens and one finish.
        while let Some(update) = self.next(text).await? {
            tokens.extend(update.token);
            all.push_str(&update.text);
            if let Some(finish) = update.finish {
                return Ok((tokens, all, finish));
            }
        }
        Err(ServeError::WorkerGone)
    }
}

/// The text of a generation with `checked`'s detokenising and stop settings.
pub fn text_stream<'a>(app: &'a App, checked: &'a Checked) -> TextStream<'a> {
    TextStream::new(
        &app.tokenizer,
        checked.skip_special_tokens,
        &checked.stops,
        checked.include_stop,
    )
}

/// What a stream sends next: one token with its text, or the last tokens with the finish.
#[derive(Debug)]
pub enum Chunk {
    Token(SampledToken, String),
    Last(Vec<SampledToken>, String, Finish),
}

/// Pairs each token with its text for a stream, holding the latest one back until the next
/// update, so that the finish reason rides on the last token's chunk (as in vLLM) rather than
/// on a chunk of its own.
#[derive(Debug, Default)]
pub struct Chunker {
    held: Option<(SampledToken, String)>,
}

impl Chunker {
    pub fn take(&mut self, update: Update) -> Option<Chunk> {
        let Some(finish) = update.finish else {
            let token = update.token?;
            return self
                .held
                .replace((token, update.text))
                .map(|(token, text)| Chunk::Token(token, text));
        };
        let (mut tokens, mut text) = match self.held.take() {
            Some((token, text)) => (vec![token], text),
            None => (Vec::new(), String::new()),
        };
        tokens.extend(update.token);
        text.push_str(&update.text);
        Some(Chunk::Last(tokens, text, finish))
    }
}
