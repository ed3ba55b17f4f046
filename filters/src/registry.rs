//! The plugins of a directory, kept current: every `*.wasm` file is a plugin named by its stem.
//! A changed file is compiled beside the running version and swapped in atomically; calls in
//! flight finish on the version they started with. A file that no longer loads is refused and
//! the previous version keeps running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use wasmtime::component::Linker;

use crate::breaker::Breaker;
use crate::config::BreakerConfig;
use crate::metrics::{Metrics, PluginLabels, ReloadLabels};
use crate::plugin::{self, LoadError, Plugin};
use crate::sandbox::{CallState, Sandbox};

/// A plugin version in service, with its own circuit breaker.
pub struct Loaded {
    pub plugin: Arc<Plugin>,
    pub breaker: Arc<Breaker>,
    /// The file's modification time and length when it was loaded: a cheap change check.
    stamp: (Option<SystemTime>, u64),
}

pub struct Registry {
    dir: PathBuf,
    sandbox: Arc<Sandbox>,
    linker: Linker<CallState>,
    breaker: BreakerConfig,
    metrics: Metrics,
    plugins: RwLock<BTreeMap<String, Arc<Loaded>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot read the plugin directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Load(#[from] LoadError),
}

fn stamp(path: &Path) -> Option<(Option<SystemTime>, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok(), meta.len()))
}

/// The `*.wasm` files of `dir`, by plugin name.
fn scan(dir: &Path) -> Result<BTreeMap<String, PathBuf>, RegistryError> {
    let entries = std::fs::read_dir(dir).map_err(|source| RegistryError::Dir {
        dir: dir.to_owned(),
        source,
    })?;
    let mut files = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "wasm") && path.is_file() {
            if let Some(name) = plugin::name_of(&path) {
                files.insert(name, path);
            }
        }
    }
    Ok(files)
}

impl Registry {
    /// Loads every plugin of `dir`; any plugin that does not load is an error (at start, a
    /// broken plugin is a configuration mistake to fix, not to skip).
    pub async fn open(
        dir: PathBuf,
        sandbox: Arc<Sandbox>,
        breaker: BreakerConfig,
        metrics: Metrics,
    ) -> Result<Self, RegistryError> {
        let linker = plugin::linker(&sandbox)?;
        let mut plugins = BTreeMap::new();
        for (name, path) in scan(&dir)? {
            let stamp = stamp(&path).unwrap_or((None, 0));
            let plugin = Plugin::load(&sandbox, &linker, &path).await?;
            tracing::info!(plugin = %name, hash = %plugin.content_hash, "filter plugin loaded");
            metrics
                .reloads
                .get_or_create(&ReloadLabels {
                    plugin: plugin.name.clone(),
                    result: "loaded",
                })
                .inc();
            plugins.insert(
                name,
                Arc::new(Loaded {
                    plugin,
                    breaker: Arc::new(Breaker::new(breaker.clone())),
                    stamp,
                }),
            );
        }
        Ok(Self {
            dir,
            sandbox,
            linker,
            breaker,
            metrics,
            plugins: RwLock::new(plugins),
        })
    }

    /// The plugins in service now.
    pub fn snapshot(&self) -> Vec<Arc<Loaded>> {
        self.plugins
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Loads new and changed files, drops removed ones. A file that fails to load is refused
    /// (logged, counted) and its previous version, if any, stays.
    pub async fn rescan(&self) {
        let files = match scan(&self.dir) {
            Ok(files) => files,
            Err(e) => {
                tracing::warn!(error = %e, "filter plugins not rescanned");
                return;
            }
        };
        let current: BTreeMap<String, (Option<SystemTime>, u64)> = self
            .plugins
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, loaded)| (name.clone(), loaded.stamp))
            .collect();
        for (name, path) in &files {
            let Some(stamp) = stamp(path) else { continue };
            if current.get(name) == Some(&stamp) {
                continue;
            }
            let bytes = match std::fs::read(path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(plugin = %name, error = %e, "changed filter plugin not readable");
                    continue;
                }
            };
            let unchanged = self
                .plugins
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .is_some_and(|loaded| loaded.plugin.content_hash == plugin::content_hash(&bytes));
            if unchanged {
                self.restamp(name, stamp);
                continue;
            }
            match Plugin::from_bytes(&self.sandbox, &self.linker, path, &bytes).await {
                Ok(plugin) => {
                    tracing::info!(plugin = %name, hash = %plugin.content_hash, "filter plugin reloaded");
                    self.count_reload(&plugin.name, "loaded");
                    self.metrics
                        .disabled
                        .get_or_create(&PluginLabels {
                            plugin: plugin.name.clone(),
                        })
                        .set(0);
                    let loaded = Arc::new(Loaded {
                        plugin,
                        breaker: Arc::new(Breaker::new(self.breaker.clone())),
                        stamp,
                    });
                    self.plugins
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name.clone(), loaded);
                }
                Err(e) => {
                    // Not retried until the file changes again.
                    self.restamp(name, stamp);
                    tracing::error!(plugin = %name, error = %e, "changed filter plugin refused; the previous version keeps running");
                    self.count_reload(
                        &crate::metrics::PluginName(Arc::from(name.as_str())),
                        "refused",
                    );
                }
            }
        }
        let mut plugins = self.plugins.write().unwrap_or_else(|p| p.into_inner());
        plugins.retain(|name, _| {
            let keep = files.contains_key(name);
            if !keep {
                tracing::info!(plugin = %name, "filter plugin removed");
            }
            keep
        });
    }

    fn restamp(&self, name: &str, stamp: (Option<SystemTime>, u64)) {
        let mut plugins = self.plugins.write().unwrap_or_else(|p| p.into_inner());
        if let Some(loaded) = plugins.get(name) {
            let refreshed = Arc::new(Loaded {
                plugin: Arc::clone(&loaded.plugin),
                breaker: Arc::clone(&loaded.breaker),
                stamp,
            });
            plugins.insert(name.to_owned(), refreshed);
        }
    }

    fn count_reload(&self, plugin: &crate::metrics::PluginName, result: &'static str) {
        self.metrics
            .reloads
            .get_or_create(&ReloadLabels {
                plugin: plugin.clone(),
                result,
            })
            .inc();
    }
}
