//! Reads the JSON files of model and adapter folders (`config.json`, `adapter_config.json`,
//! the shard index, `tokenizer_config.json`), naming the file in any error.

use std::path::Path;

use serde::de::DeserializeOwned;

/// A JSON file that could not be read or did not have the expected shape.
#[derive(Debug, thiserror::Error)]
pub enum JsonFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not what was expected: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

pub fn read<T: DeserializeOwned>(path: &Path) -> Result<T, JsonFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| JsonFileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| JsonFileError::Parse {
        path: path.display().to_string(),
        source,
    })
}
