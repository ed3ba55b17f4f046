//! Opens the datapool the recorder writes to: Redis behind a local spool when `redis` is set
//! (an outage never loses a served step: it waits in the spool and is replayed in order), else
//! the embedded SQLite store in `data_dir`, which a trainer on the same machine reads too.

use std::path::PathBuf;
use std::sync::Arc;

use clawback_datapool::{LocalStore, RedisConfig, RedisStore, SpoolConfig, SpooledStore, Store};

use crate::config::Config;

/// File name of the embedded store inside `data_dir`.
pub const LOCAL_FILE: &str = "clawback.sqlite3";
/// File name of the Redis spool inside `data_dir`.
pub const SPOOL_FILE: &str = "spool.sqlite3";

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

pub async fn open(config: &Config) -> Result<Arc<dyn Store>, OpenError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|source| OpenError::DataDir {
        dir: config.data_dir.clone(),
        source,
    })?;
    match &config.redis {
        None => Ok(Arc::new(LocalStore::open(
            config.data_dir.join(LOCAL_FILE),
        )?)),
        Some(url) => {
            let redis_config = if config.redis_cluster {
                RedisConfig::cluster(url.split(',').map(str::trim).filter(|u| !u.is_empty()))
            } else {
                RedisConfig::single(url.clone())
            };
            let redis = RedisStore::connect(&redis_config).await?;
            let spool = LocalStore::open(config.data_dir.join(SPOOL_FILE))?;
            Ok(Arc::new(
                SpooledStore::new(redis, spool, SpoolConfig::default()).await?,
            ))
        }
    }
}
