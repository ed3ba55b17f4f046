//! Generated token ids → the text a client sees, one token at a time: incremental
//! detokenisation that never emits half a UTF-8 character, and stop strings that end the
//! reply without ever showing their first characters early.
//!
//! Each token re-decodes the whole completion and emits what grew at the end, so a stream's
//! pieces always add up to the decoded completion; while the decoded text ends in U+FFFD (a
//! multi-byte character whose remaining bytes are still to come) nothing is emitted. A
//! completion is short enough that the repeated decoding costs less than one forward pass.

use clawback_model::tokenizer::{Tokenizer, TokenizerError};

/// What one more token did to the visible text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// New text to show (possibly empty: the token is held back or has no text of its own).
    Text(String),
    /// A stop string appeared: show this text, then end the reply with `stop_reason`.
    Stopped { text: String, stop: String },
}

/// The text of one completion as it is generated.
#[derive(Debug)]
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    stops: &'a [String],
    include_stop: bool,
    ids: Vec<i64>,
    /// The last decoding of `ids` that did not end inside a character.
    decoded: String,
    /// Bytes of `decoded` already handed out.
    emitted: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(
        tokenizer: &'a Tokenizer,
        skip_special_tokens: bool,
        stops: &'a [String],
        include_stop: bool,
    ) -> Self {
        TextStream {
            tokenizer,
            skip_special_tokens,
            stops,
            include_stop,
            ids: Vec::new(),
            decoded: String::new(),
            emitted: 0,
        }
    }

    /// Adds a generated token.
    pub fn push(&mut self, id: i64) -> Result<Piece, TokenizerError> {
        self.ids.push(id);
        let full = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if full.ends_with('\u{FFFD}') || !self.extends_emitted(&full) {
            return Ok(Piece::Text(String::new()));
        }
        self.decoded = full;
        if let Some((at, stop)) = self.first_stop() {
            let end = if self.include_stop {
                at + stop.len()
            } else {
                at
            };
            let text = self.decoded[self.emitted..end.max(self.emitted)].to_owned();
            self.emitted = end.max(self.emitted);
            return Ok(Piece::Stopped { text, stop });
        }
        let held = self.partial_stop_len();
        let end = self.decoded.len() - held;
        let text = self.decoded[self.emitted..end].to_owned();
        self.emitted = end;
        Ok(Piece::Text(text))
    }

    /// What is still held back once generation has ended (a partial character, or text that
    /// only looked like the start of a stop string).
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        let full = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if !self.extends_emitted(&full) {
            return Ok(String::new());
        }
        let text = full[self.emitted..].to_owned();
        self.emitted = full.len();
        self.decoded = full;
        Ok(text)
    }

    /// Whether `full` still begins with what was handed out, so its new end can follow it.
    fn extends_emitted(&self, full: &str) -> bool {
        full.is_char_boundary(self.emitted) && full[..self.emitted] == self.decoded[..self.emitted]
    }

    /// The earliest stop string in the text not yet handed out (a stop string never starts
    /// inside handed-out text: any beginning of one is held back).
    fn first_stop(&self) -> Option<(usize, String)> {
        let rest = &self.decoded[self.emitted..];
        self.stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                rest.find(s.as_str())
                    .map(|at| (self.emitted + at, s.clone()))
            })
            .min_by_key(|(at, _)| *at)
    }

    /// The longest end of the unsent text that is the beginning of some stop string.
    fn partial_stop_len(&self) -> usize {
        let rest = &self.decoded[self.emitted..];
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len())
                    .filter(|&n| stop.is_char_boundary(n) && rest.ends_with(&stop[..n]))
                    .max()
            })
            .max()
            .unwrap_or(0)
    }
}
