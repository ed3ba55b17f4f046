//! clawback's datapool: the trajectory schema every process shares, and the stores that keep it.
//!
//! - [`schema`]: [`Trajectory`], [`Step`], [`Evaluation`], [`Group`], [`PolicyVersion`] (see
//!   `SCHEMA.md`);
//! - [`EncodedStep`]: a step serialised once, as the journal, the spool and the stores carry it;
//! - [`Store`]: what the recorder writes and the trainer reads, implemented by [`RedisStore`]
//!   (Redis Streams, one Redis or a cluster), [`LocalStore`] (SQLite: the embedded default and the
//!   spool) and [`SpooledStore`] (Redis, falling back to a local spool while Redis is away);
//! - [`Sessions`]: the session state every sidecar replica of a pool shares (which trajectory a
//!   call joins), on Redis ([`RedisStore`]) or SQLite ([`LocalSessions`]);
//! - [`reward`]: how evaluations combine into the rewards and hints a trainer learns from.

mod codec;
pub mod encoded;
pub mod error;
pub mod example;
pub mod ids;
pub mod keys;
pub mod local_sessions;
pub mod local_store;
pub mod logprobs;
pub mod packed;
mod redis_scripts;
mod redis_session_scripts;
mod redis_sessions;
pub mod redis_store;
pub mod reward;
pub mod schema;
pub mod sessions;
pub mod spool;
pub mod store;
pub mod write_op;

pub use encoded::EncodedStep;
pub use error::{Error, Result};
pub use ids::{EvaluationId, GroupId, StepId, TenantId, TrajectoryId, UnixMs};
pub use local_sessions::LocalSessions;
pub use local_store::LocalStore;
pub use logprobs::{CompletionLogprobs, TokenRef};
pub use redis_store::{Caps, RedisConfig, RedisStore};
pub use schema::*;
pub use sessions::{
    Anchor, Finish, Finishing, Join, Joined, KeyedSession, Matched, Prefix, Previous, Sessions,
    StepDone, StepSlot, StitchKey, Timing,
};
pub use spool::{SpoolConfig, SpoolStats, SpooledStore};
pub use store::{
    Complete, Completed, Consumer, ConsumerGroupLag, ConsumerName, DeadLetter, Delivery,
    DeliveryId, ReadyItem, Store,
};
pub use write_op::WriteOp;
