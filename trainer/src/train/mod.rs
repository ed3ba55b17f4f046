//! `clawback-trainer train`: the training loop over the datapool. Each tenant gets its own LoRA
//! adapter and optimizer over one frozen base in the same process; ready deliveries become
//! scored samples, micro-batches, AdamW steps, metrics and checkpoints, and a delivery is acked
//! only once a checkpoint holds its data.
//!
//! | file | job |
//! |---|---|
//! | `config.rs` | `TrainConfig`: the TOML file and `CLAWBACK_TRAINER_*` overrides |
//! | `run.rs` | the loop: read, ingest, step, checkpoint, ack, stop on signals |
//! | `tenant.rs` | one tenant's adapter, optimizer, queue and exactly-once bookkeeping |
//! | `advantages.rs` | a delivery's trajectories → rewards → samples with advantages and teacher prompts |
//! | `canary.rs` | a candidate on trial: its users' rewards beside the live version's, and the rule |
//! | `batch.rs` | micro-batches under a token budget, laid out as loss tensors |
//! | `text.rs` | re-tokenising text-only steps, hint-augmented teacher prompts |
//! | `checkpoint.rs` | atomic checkpoints: PEFT adapter, optimizer moments, state |
//! | `metrics.rs` | progress line, JSONL log, Prometheus `/metrics` |
//! | `error.rs` | `TrainError` |

pub mod advantages;
pub mod batch;
pub mod canary;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod metrics;
pub mod run;
pub mod tenant;
pub mod text;

pub use config::TrainConfig;
pub use error::TrainError;
pub use run::{run, RunOptions, Summary};
