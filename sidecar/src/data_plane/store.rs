//! Opens the datapool the recorder writes to: Redis behind a local spool when `redis` is set
//! (an outage never loses a served step: it waits in the spool and is replayed in order), else
//! the embedded SQLite store in `data_dir`, which a trainer on the same machine reads too — and
//! the session state the replicas share: in Redis, or in a SQLite file of its own in `data_dir`
//! (replicas on one machine that share `data_dir` share it).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawback_datapool::{
    Caps, LocalSessions, LocalStore, RedisConfig, RedisStore, Sessions, SpoolConfig, SpooledStore,
    Store,
};

/// File name of the embedded store inside `data_dir`.
pub const LOCAL_FILE: &str = "clawback.sqlite3";
/// File name of the Redis spool inside `data_dir`.
pub const SPOOL_FILE: &str = "spool.sqlite3";
/// File name of the embedded session state inside `data_dir`.
pub const SESSIONS_FILE: &str = "sessions.sqlite3";

/// The datapool: where steps go, and the session state replicas share.
#[derive(Clone)]
pub struct Datapool {
    pub store: Arc<dyn Store>,
    pub sessions: Arc<dyn Sessions>,
    /// Whether `sessions` is reached over the network (a timeout applies to it).
    pub remote_sessions: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {dir}: {source}")]
    DataDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the datapool: {0}")]
    Datapool(#[from] clawback_datapool::Error),
}

/// Where the datapool is: the config's `redis`, `redis_cluster` and `data_dir`.
#[derive(Debug, Clone, Copy)]
pub struct Location<'a> {
    /// Redis's URL (a cluster's comma-separated seeds); `None`: the embedded store.
    pub redis: Option<&'a str>,
    pub redis_cluster: bool,
    /// The embedded store, the spool and the embedded session state.
    pub data_dir: &'a Path,
}

pub async fn open(config: Location<'_>) -> Result<Datapool, OpenError> {
    // It holds conversations: a new folder is its owner's alone, whatever the umask says.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(config.data_dir)
        .map_err(|source| OpenError::DataDir {
            dir: config.data_dir.to_owned(),
            source,
        })?;
    match config.redis {
        None => Ok(Datapool {
            // Bounded per tenant as Redis is: one tenant cannot fill the disk for all.
            store: Arc::new(
                LocalStore::open(config.data_dir.join(LOCAL_FILE))?.with_caps(Caps::default()),
            ),
            sessions: Arc::new(LocalSessions::open(config.data_dir.join(SESSIONS_FILE))?),
            remote_sessions: false,
        }),
        Some(url) => {
            let redis_config = if config.redis_cluster {
                RedisConfig::cluster(url.split(',').map(str::trim).filter(|u| !u.is_empty()))
            } else {
                RedisConfig::single(url.to_owned())
            };
            let redis = RedisStore::connect(&redis_config).await?;
            let spool = LocalStore::open(config.data_dir.join(SPOOL_FILE))?;
            let store = Arc::new(SpooledStore::new(redis, spool, SpoolConfig::default()).await?);
            Ok(Datapool {
                store: Arc::clone(&store) as Arc<dyn Store>,
                sessions: store,
                remote_sessions: true,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[tokio::test]
    async fn the_embedded_stores_files_are_their_owners_alone_whatever_the_umask() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let data_dir = dir.path().join("data");
        let pool = open(Location {
            redis: None,
            redis_cluster: false,
            data_dir: &data_dir,
        })
        .await
        .expect("the embedded store opens");
        drop(pool);
        let mode = |path: &Path| {
            std::fs::metadata(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(&data_dir), 0o700);
        for file in [LOCAL_FILE, SESSIONS_FILE] {
            assert_eq!(mode(&data_dir.join(file)), 0o600, "{file}");
            let wal = data_dir.join(format!("{file}-wal"));
            if wal.exists() {
                assert_eq!(mode(&wal), 0o600, "{file}-wal");
            }
        }
    }
}
