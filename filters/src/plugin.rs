//! One plugin: a component file compiled once and pre-instantiated against the filter world,
//! named by its file stem and identified by the SHA-256 of its bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};

use crate::bindings::{Filter, FilterPre, PluginInfo, WORLD};
use crate::host::CallHost;
use crate::metrics::PluginName;
use crate::sandbox::{CallState, Sandbox};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read plugin {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("plugin {path} has no usable file name (expected NAME.wasm)")]
    Name { path: PathBuf },
    #[error("{path} is not a Wasm component (build it with `cargo build --target wasm32-wasip2`): {reason}")]
    NotAComponent { path: PathBuf, reason: String },
    #[error("plugin {path} was built against a different world than {WORLD}; rebuild it with the current clawback-filter-sdk: {reason}")]
    WrongWorld { path: PathBuf, reason: String },
    #[error("plugin {path} failed to describe itself: {reason}")]
    Describe { path: PathBuf, reason: String },
    #[error("cannot link the host functions: {0}")]
    Linker(String),
}

/// A compiled, pre-instantiated plugin. Calls in flight keep their `Arc<Plugin>`, so a reload
/// never pulls a plugin out from under them.
pub struct Plugin {
    pub name: PluginName,
    /// `sha256:<hex>` of the component bytes, recorded on every evaluation.
    pub content_hash: String,
    pub path: PathBuf,
    pub info: PluginInfo,
    pre: FilterPre<CallState>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("content_hash", &self.content_hash)
            .field("path", &self.path)
            .finish()
    }
}

/// The host functions every plugin is linked against: WASI (granting nothing, see
/// [`Sandbox::store`]) and the filter world's `host` interface.
pub fn linker(sandbox: &Sandbox) -> Result<Linker<CallState>, LoadError> {
    let mut linker = Linker::new(sandbox.engine());
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)
        .map_err(|e| LoadError::Linker(format!("{e:#}")))?;
    Filter::add_to_linker::<_, HasSelf<CallHost>>(&mut linker, |state: &mut CallState| {
        &mut state.host
    })
    .map_err(|e| LoadError::Linker(format!("{e:#}")))?;
    Ok(linker)
}

/// The plugin name of a file: its stem.
pub fn name_of(path: &Path) -> Option<String> {
    let stem = path.file_stem()?.to_str()?;
    (!stem.is_empty()).then(|| stem.to_owned())
}

/// `sha256:<hex>` of `bytes`.
pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Plugin {
    /// Reads, compiles and checks a plugin file. Compiling takes a while: call it off the
    /// async threads.
    pub async fn load(
        sandbox: &Sandbox,
        linker: &Linker<CallState>,
        path: &Path,
    ) -> Result<Arc<Plugin>, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(sandbox, linker, path, &bytes).await
    }

    pub async fn from_bytes(
        sandbox: &Sandbox,
        linker: &Linker<CallState>,
        path: &Path,
        bytes: &[u8],
    ) -> Result<Arc<Plugin>, LoadError> {
        let name = name_of(path).ok_or_else(|| LoadError::Name {
            path: path.to_owned(),
        })?;
        let component = Component::from_binary(sandbox.engine(), bytes).map_err(|e| {
            LoadError::NotAComponent {
                path: path.to_owned(),
                reason: format!("{e:#}"),
            }
        })?;
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            path: path.to_owned(),
            reason: format!("{e:#}"),
        };
        let instance_pre = linker.instantiate_pre(&component).map_err(wrong_world)?;
        let pre = FilterPre::new(instance_pre).map_err(wrong_world)?;
        let name = PluginName(Arc::from(name.as_str()));
        let info = describe(sandbox, &pre, &name)
            .await
            .map_err(|reason| LoadError::Describe {
                path: path.to_owned(),
                reason,
            })?;
        Ok(Arc::new(Plugin {
            name,
            content_hash: content_hash(bytes),
            path: path.to_owned(),
            info,
            pre,
        }))
    }

    /// A fresh instance in `store`.
    pub async fn instantiate(
        &self,
        store: &mut wasmtime::Store<CallState>,
    ) -> wasmtime::Result<Filter> {
        self.pre.instantiate_async(store).await
    }
}

async fn describe(
    sandbox: &Sandbox,
    pre: &FilterPre<CallState>,
    name: &PluginName,
) -> Result<PluginInfo, String> {
    let host = CallHost::new(name.clone(), String::new(), Arc::default(), None);
    let mut store = sandbox.store(host).map_err(|e| e.to_string())?;
    let filter = pre
        .instantiate_async(&mut store)
        .await
        .map_err(|e| format!("{e:#}"))?;
    filter
        .call_describe(&mut store)
        .await
        .map_err(|e| format!("{e:#}"))
}
