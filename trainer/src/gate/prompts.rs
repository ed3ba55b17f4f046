//! A prompt set's file: JSON lines, one prompt each, the rest of the line its metadata.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

/// One prompt and what its checks read (`answer`, ...).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Prompt {
    pub prompt: String,
    #[serde(flatten)]
    pub metadata: Map<String, Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum PromptsError {
    #[error("cannot read the prompt set {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: {problem}")]
    Line {
        path: String,
        line: usize,
        problem: String,
    },
    #[error("the prompt set {0} holds no prompt")]
    Empty(String),
}

/// The prompts of the file at `path`; blank lines and lines starting with `#` are skipped.
pub fn load(path: &Path) -> Result<Vec<Prompt>, PromptsError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PromptsError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |problem: String| PromptsError::Line {
            path: shown.clone(),
            line: i + 1,
            problem,
        };
        let prompt: Prompt = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        if prompt.prompt.trim().is_empty() {
            return Err(bad("an empty prompt".to_owned()));
        }
        prompts.push(prompt);
    }
    if prompts.is_empty() {
        return Err(PromptsError::Empty(shown));
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_is_a_prompt_and_the_rest_of_it_metadata() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("set.jsonl");
        std::fs::write(
            &file,
            "# capitals\n{\"prompt\": \"What is the capital of France?\", \"answer\": \"Paris\"}\n\n{\"prompt\": \"Say hi.\"}\n",
        )
        .expect("write");
        let prompts = load(&file).expect("loads");
        assert_eq!(prompts.len(), 2);
        assert_eq!(prompts[0].metadata["answer"], "Paris");
        assert!(prompts[1].metadata.is_empty());
    }

    #[test]
    fn a_bad_line_is_named_by_its_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("set.jsonl");
        std::fs::write(&file, "{\"prompt\": \"ok\"}\n{\"answer\": \"no prompt\"}\n")
            .expect("write");
        let error = load(&file).expect_err("refused").to_string();
        assert!(error.contains("line 2"), "{error}");
        std::fs::write(&file, "# nothing\n").expect("write");
        assert!(matches!(load(&file), Err(PromptsError::Empty(_))));
    }
}
