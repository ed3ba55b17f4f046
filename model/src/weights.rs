//! Reads a checkpoint's tensors from a Hugging Face folder: `model.safetensors`, or the
//! shards listed in `model.safetensors.index.json`.
//!
//! Tensors are handed out by name, each exactly once, with their shape checked against
//! what the model expects: a checkpoint that does not fit the config fails at load time
//! with the tensor's name rather than with a shape error deep inside a forward pass.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use crate::json_file::{self, JsonFileError};

/// What went wrong reading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{dir} has neither model.safetensors nor model.safetensors.index.json")]
    NoCheckpoint { dir: String },
    #[error("bad safetensors index: {0}")]
    Index(#[from] JsonFileError),
    #[error("cannot load tensors from {path}: {source}")]
    Safetensors {
        path: String,
        #[source]
        source: tch::TchError,
    },
    #[error("the checkpoint has no tensor {0}")]
    Missing(String),
    #[error("tensor {name} has shape {got:?}, the config implies {want:?}")]
    Shape {
        name: String,
        got: Vec<i64>,
        want: Vec<i64>,
    },
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

/// Where a model's tensors come from: a checkpoint on disk, or fresh random values for
/// benchmarks and tests that need a model of some size but not a trained one.
pub struct Checkpoint {
    source: Source,
}

enum Source {
    Loaded(HashMap<String, Tensor>),
    Random {
        device: Device,
        kind: Kind,
        std: f64,
    },
}

impl Checkpoint {
    /// Loads every tensor of the checkpoint in `dir` onto `device` as `kind`.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, WeightsError> {
        let mut tensors = HashMap::new();
        for file in checkpoint_files(dir)? {
            let named =
                Tensor::read_safetensors(&file).map_err(|source| WeightsError::Safetensors {
                    path: file.display().to_string(),
                    source,
                })?;
            for (name, t) in named {
                // Floating weights take the compute dtype; integer buffers keep theirs.
                let t = if t.is_floating_point() {
                    t.to_device(device).to_kind(kind)
                } else {
                    t.to_device(device)
                };
                tensors.insert(name, t);
            }
        }
        Ok(Checkpoint {
            source: Source::Loaded(tensors),
        })
    }

    /// Wraps tensors made in memory.
    pub fn from_tensors(tensors: HashMap<String, Tensor>) -> Self {
        Checkpoint {
            source: Source::Loaded(tensors),
        }
    }

    /// Hands out random tensors of whatever shape is asked for: norm weights 1, biases 0,
    /// everything else N(0, std²) (transformers initialises with std 0.02). Seed with
    /// `tch::manual_seed`.
    pub fn random(device: Device, kind: Kind, std: f64) -> Self {
        Checkpoint {
            source: Source::Random { device, kind, std },
        }
    }

    /// Removes and returns the tensor `name`, checking its shape.
    pub fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor, WeightsError> {
        let tensors = match &mut self.source {
            Source::Loaded(tensors) => tensors,
            Source::Random { device, kind, std } => {
                let options = (*kind, *device);
                return Ok(if name.ends_with("norm.weight") {
                    Tensor::ones(shape, options)
                } else if name.ends_with(".bias") {
                    Tensor::zeros(shape, options)
                } else {
                    Tensor::randn(shape, options) * *std
                });
            }
        };
        let t = tensors
            .remove(name)
            .ok_or_else(|| WeightsError::Missing(name.to_owned()))?;
        if t.size() != shape {
            return Err(WeightsError::Shape {
                name: name.to_owned(),
                got: t.size(),
                want: shape.to_vec(),
            });
        }
        Ok(t)
    }
}

/// The safetensors files that make up the checkpoint in `dir`, each listed once.
fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index_path = dir.join("model.safetensors.index.json");
    if !index_path.exists() {
        return Err(WeightsError::NoCheckpoint {
            dir: dir.display().to_string(),
        });
    }
    let index: ShardIndex = json_file::read(&index_path)?;
    let shards: BTreeSet<&String> = index.weight_map.values().collect();
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_of_the_wrong_shape_is_named() {
        let mut ck = Checkpoint::from_tensors(HashMap::from([(
            "model.norm.weight".to_owned(),
            Tensor::ones([8], (Kind::Float, Device::Cpu)),
        )]));
        let err = ck.take("model.norm.weight", &[16]).unwrap_err();
        assert!(err.to_string().contains("model.norm.weight"), "{err}");
        assert!(matches!(
            ck.take("lm_head.weight", &[1]),
            Err(WeightsError::Missing(_))
        ));
    }

    #[test]
    fn shards_are_read_through_the_index() {
        let dir = std::env::temp_dir().join(format!("clawback-shards-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = Tensor::from_slice(&[1.0f32, 2.0]);
        let b = Tensor::from_slice(&[3.0f32]);
        Tensor::write_safetensors(&[("a", &a)], dir.join("model-00001-of-00002.safetensors"))
            .unwrap();
        Tensor::write_safetensors(&[("b", &b)], dir.join("model-00002-of-00002.safetensors"))
            .unwrap();
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"metadata": {"total_size": 12}, "weight_map": {
                "a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let mut ck = Checkpoint::load(&dir, Device::Cpu, Kind::Float).unwrap();
        assert_eq!(ck.take("b", &[1]).unwrap().double_value(&[0]), 3.0);
        assert_eq!(ck.take("a", &[2]).unwrap().double_value(&[1]), 2.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
