//! clawback's trainer: the RL losses, batches of samples from recorded trajectories, the
//! optimizer and its schedule, the training loop over the datapool ([`train`]), checkpoints,
//! the gate a version passes before it goes live ([`gate`]), and publishing each version into
//! the backends ([`publish`]). The model it trains lives in
//! `clawback-model`.

pub mod bench;
pub mod gate;
pub mod losses;
pub mod optim;
pub mod publish;
pub mod sampler;
pub mod samples;
pub mod schedule;
pub mod scoring;
pub mod train;
