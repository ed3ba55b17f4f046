//! The datapool's one error type: every store operation fails with a [`Error`] whose variant says
//! what went wrong in the caller's words, and whose [`Error::label`] is a low-cardinality string
//! for metrics (the recorder counts dropped steps by it).

/// Everything that can go wrong in the datapool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tenant id that cannot be used inside a Redis key (see [`crate::TenantId::new`]).
    #[error("invalid tenant id {0:?}: use 1-64 characters of [A-Za-z0-9._-]")]
    InvalidTenant(String),

    /// A consumer-group or consumer name that cannot be used as a key part.
    #[error("invalid consumer name {0:?}: use 1-64 characters of [A-Za-z0-9._-]")]
    InvalidConsumerName(String),

    /// The Redis URL could not be parsed or names an unsupported scheme.
    #[error("invalid Redis URL: {0}")]
    InvalidRedisUrl(#[source] redis::RedisError),

    /// Redis cannot take commands now: unreachable (refused, dropped, timed out), loading, a
    /// cluster down, out of memory under `noeviction`, a replica after a failover (`READONLY`),
    /// busy with a script, or refusing writes after a failed save. Writes through a
    /// [`crate::SpooledStore`] go to the spool instead.
    #[error("Redis is unreachable: {0}")]
    RedisUnavailable(#[source] redis::RedisError),

    /// Redis answered with an error (wrong type, script error, ...): retrying will not help.
    #[error("Redis refused the command: {0}")]
    Redis(#[source] redis::RedisError),

    /// Redis answered with a shape this crate does not expect (a key written by someone else?).
    #[error("unexpected Redis reply for {what}: {detail}")]
    UnexpectedReply { what: &'static str, detail: String },

    /// The SQLite database failed.
    #[error("SQLite failed: {0}")]
    Sqlite(#[from] rusqlite::Error),

    /// The blocking SQLite task panicked or was cancelled.
    #[error("the SQLite worker task failed: {0}")]
    SqliteTask(#[from] tokio::task::JoinError),

    /// A stored record could not be encoded or decoded.
    #[error("could not encode or decode a stored {what}: {source}")]
    Codec {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// A record was written by a newer clawback whose schema this build does not know.
    #[error("stored {what} has schema version {found}, this build reads up to {supported}")]
    UnsupportedSchema {
        what: &'static str,
        found: u32,
        supported: u32,
    },

    /// The trajectory does not exist for this tenant (never created, or trimmed by a cap).
    #[error("unknown trajectory {trajectory} of tenant {tenant}")]
    UnknownTrajectory { tenant: String, trajectory: String },

    /// A batch mixed records of several tenants where one tenant was required.
    #[error("a {what} names tenant {found} but the call is for tenant {expected}")]
    TenantMismatch {
        what: &'static str,
        expected: String,
        found: String,
    },

    /// A policy version older than the live one was set: two trainers raced, the older lost.
    #[error("policy version {attempted} of tenant {tenant} is older than the live version {live}")]
    StalePolicyVersion {
        tenant: String,
        attempted: u64,
        live: u64,
    },

    /// Redis was not tried: earlier writes still wait in the spool, and this one must follow them.
    #[error("queued behind writes that wait in the spool")]
    QueuedBehindSpool,

    /// Both Redis and the spool failed: the write is lost and the caller should count it.
    #[error("Redis could not take the write ({primary}) and the spool failed too ({spool})")]
    SpoolFailed {
        primary: Box<Error>,
        spool: Box<Error>,
    },

    /// The call itself is wrong (completing a trajectory as `open`, a zero count, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
}

impl Error {
    /// A short, fixed label for metrics (`clawback_datapool_errors_total{kind=...}`).
    pub fn label(&self) -> &'static str {
        match self {
            Error::InvalidTenant(_) => "invalid_tenant",
            Error::InvalidConsumerName(_) => "invalid_consumer_name",
            Error::InvalidRedisUrl(_) => "invalid_redis_url",
            Error::RedisUnavailable(_) => "redis_unavailable",
            Error::Redis(_) => "redis",
            Error::UnexpectedReply { .. } => "unexpected_reply",
            Error::Sqlite(_) => "sqlite",
            Error::SqliteTask(_) => "sqlite_task",
            Error::Codec { .. } => "codec",
            Error::UnsupportedSchema { .. } => "unsupported_schema",
            Error::UnknownTrajectory { .. } => "unknown_trajectory",
            Error::TenantMismatch { .. } => "tenant_mismatch",
            Error::StalePolicyVersion { .. } => "stale_policy_version",
            Error::QueuedBehindSpool => "queued_behind_spool",
            Error::SpoolFailed { .. } => "spool_failed",
            Error::InvalidRequest(_) => "invalid_request",
        }
    }

    /// Whether the failure is Redis unable to take commands now (worth spooling and retrying),
    /// as opposed to a request that will fail the same way every time.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::RedisUnavailable(_))
    }

    /// Whether the same write may be taken later: Redis unable to take it now, a spool that
    /// failed too, SQLite busy, locked, full or failing I/O. The recorder retries these and
    /// drops only writes that will fail the same way every time.
    pub fn is_transient(&self) -> bool {
        use rusqlite::ErrorCode;
        match self {
            Error::RedisUnavailable(_) | Error::SpoolFailed { .. } | Error::SqliteTask(_) => true,
            Error::Sqlite(e) => matches!(
                e.sqlite_error_code(),
                Some(
                    ErrorCode::DatabaseBusy
                        | ErrorCode::DatabaseLocked
                        | ErrorCode::DiskFull
                        | ErrorCode::SystemIoFailure
                        | ErrorCode::CannotOpen
                        | ErrorCode::OutOfMemory
                        | ErrorCode::ReadOnly
                )
            ),
            _ => false,
        }
    }

    pub(crate) fn codec(what: &'static str, source: serde_json::Error) -> Self {
        Error::Codec { what, source }
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        let away = err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.is_timeout()
            || err.is_cluster_error()
            || err.is_unrecoverable_error()
            || err.code().is_some_and(takes_it_later)
            // A pipeline's or a discarded transaction's errors are the commands' own.
            || err
                .clone()
                .into_server_errors()
                .is_some_and(|errors| errors.iter().any(|(_, e)| takes_it_later(e.code())));
        match away {
            true => Error::RedisUnavailable(err),
            false => Error::Redis(err),
        }
    }
}

/// Whether a Redis error code means the same command is taken later: Redis still loading its
/// data after a restart, a cluster failing over, a replica that was the primary (READONLY),
/// full under `noeviction` (OOM), busy with a script, or refusing writes after a failed save.
/// That is "away", not "refused".
fn takes_it_later(code: &str) -> bool {
    matches!(
        code,
        "LOADING"
            | "TRYAGAIN"
            | "CLUSTERDOWN"
            | "MASTERDOWN"
            | "READONLY"
            | "OOM"
            | "BUSY"
            | "NOREPLICAS"
            | "MISCONF"
    )
}

/// The datapool's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_locked_by_another_process_is_transient_and_a_bad_statement_is_not() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let path = dir.path().join("db.sqlite");
        let holder = rusqlite::Connection::open(&path).expect("opens");
        holder
            .execute_batch("CREATE TABLE t (x);")
            .expect("a table");
        let writer = rusqlite::Connection::open(&path).expect("opens");
        writer
            .busy_timeout(std::time::Duration::ZERO)
            .expect("no wait");
        let wrong = Error::from(
            writer
                .execute("INSERT INTO missing VALUES (2)", [])
                .expect_err("no such table"),
        );
        assert!(!wrong.is_transient(), "{wrong:?}");
        holder
            .execute_batch("BEGIN EXCLUSIVE; INSERT INTO t VALUES (1);")
            .expect("holds the lock");
        let busy = Error::from(
            writer
                .execute("INSERT INTO t VALUES (2)", [])
                .expect_err("locked"),
        );
        assert!(busy.is_transient(), "{busy:?}");
    }
}
