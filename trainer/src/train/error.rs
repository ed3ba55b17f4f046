//! The `train` command's one error type: what stopped the training loop, in the operator's words.

use crate::losses::LossError;
use crate::sampler::SamplerError;
use crate::train::checkpoint::CheckpointError;
use crate::train::config::ConfigError;
use crate::train::metrics::MetricsError;
use clawback_model::lora::LoraError;
use clawback_model::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot load the base model {path}: {source}")]
    Model {
        path: String,
        #[source]
        source: ModelError,
    },
    #[error("the datapool {what} failed: {source}")]
    Datapool {
        what: &'static str,
        #[source]
        source: clawback_datapool::Error,
    },
    #[error("the embedded datapool {0} does not exist (start the sidecar first, or point `datapool` at its data directory)")]
    NoDatapool(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("the forward pass failed: {0}")]
    Forward(#[from] ModelError),
    #[error("the loss failed: {0}")]
    Loss(#[from] LossError),
    #[error("cannot create the adapter: {0}")]
    Adapter(#[from] LoraError),
    #[error("a libtorch call failed: {0}")]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("cannot read the engine's sampling defaults: {0}")]
    Sampler(#[from] SamplerError),
    #[error("cannot set up publishing: {0}")]
    Publisher(String),
    #[error(transparent)]
    Gate(#[from] crate::gate::GateError),
}

impl TrainError {
    /// A datapool failure during `what`.
    pub fn datapool(what: &'static str) -> impl FnOnce(clawback_datapool::Error) -> Self {
        move |source| TrainError::Datapool { what, source }
    }

    /// The datapool could not be reached (Redis down or restarting): the loop waits and tries
    /// again rather than exit — what was read and not acked is delivered again.
    pub fn is_transient(&self) -> bool {
        matches!(self, TrainError::Datapool { source, .. } if source.is_unavailable())
    }
}
