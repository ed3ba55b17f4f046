//! Text ↔ token ids through a model's `tokenizer.json` (the `tokenizers` crate, the same
//! engine transformers' fast tokenizers run), used when a step was recorded without the
//! engine's token ids and for the teacher contexts of hint-guided distillation.

use std::path::Path;

/// What went wrong loading a tokenizer or running it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot load {path}: {message}")]
    Load { path: String, message: String },
    #[error("tokenizing failed: {0}")]
    Encode(String),
    #[error("detokenizing failed: {0}")]
    Decode(String),
}

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a model folder.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| TokenizerError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Tokenizer { inner })
    }

    /// Ids of `text`. A rendered chat template already holds its special tokens, so
    /// templates are encoded with `add_special_tokens = false`, as transformers does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>, TokenizerError> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
    }

    /// Text of `ids`, special tokens included unless `skip_special_tokens`.
    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        let ids = ids
            .iter()
            .map(|&id| {
                u32::try_from(id).map_err(|_| TokenizerError::Decode(format!("bad id {id}")))
            })
            .collect::<Result<Vec<u32>, _>>()?;
        self.inner
            .decode(&ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The id of a token string such as `<|im_end|>`, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }
}
