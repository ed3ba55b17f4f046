//! Where adapters loaded at run time may come from: folders under the roots the operator named
//! (`--lora-root`, and the resolver directory), after every symlink is resolved; names that are
//! plain ids. A load request is an outside caller naming a path on this machine, so a refusal
//! says the same thing whether the path exists, is outside the roots, or escapes them through a
//! link — vLLM 0.32's own 404 (`No adapter found for <path>`), which names no path either.

use std::path::{Path, PathBuf};

use super::error::ServeError;

/// How the server takes adapters at run time: the resolver folder, the roots, the cap.
#[derive(Debug, Clone, Default)]
pub struct RuntimeAdapters {
    /// vLLM's filesystem LoRA resolver folder (a root too).
    pub resolver_dir: Option<PathBuf>,
    pub roots: AdapterRoots,
    /// Adapters loaded at once.
    pub max_loaded: usize,
}

impl RuntimeAdapters {
    pub fn new(resolver_dir: Option<PathBuf>, roots: Vec<PathBuf>, max_loaded: usize) -> Self {
        Self {
            roots: AdapterRoots::new(roots.into_iter().chain(resolver_dir.clone())),
            resolver_dir,
            max_loaded,
        }
    }
}

/// The canonical roots runtime adapters are loaded from.
#[derive(Debug, Clone, Default)]
pub struct AdapterRoots {
    roots: Vec<PathBuf>,
}

impl AdapterRoots {
    /// Roots that do not exist are left out (nothing can be loaded from them yet); the rest are
    /// kept canonical, so a symlinked root is compared as what it points to.
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> Self {
        let roots = roots
            .into_iter()
            .filter_map(|root| match std::fs::canonicalize(&root) {
                Ok(root) => Some(root),
                Err(e) => {
                    eprintln!(
                        "clawback-serve: adapter root {} is not usable: {e}",
                        root.display()
                    );
                    None
                }
            })
            .collect();
        Self { roots }
    }

    /// The canonical folder `path` names when it is a directory under a root; `None` otherwise,
    /// whatever the reason.
    pub fn resolve(&self, path: &Path) -> Option<PathBuf> {
        let real = std::fs::canonicalize(path).ok()?;
        let inside = self
            .roots
            .iter()
            .any(|root| real.starts_with(root) && real != *root);
        (inside && real.is_dir()).then_some(real)
    }

    /// `path` as a runtime load may use it, or the one refusal.
    pub fn check(&self, name: &str, path: &Path) -> Result<PathBuf, ServeError> {
        check_name(name)?;
        self.resolve(path)
            .ok_or_else(|| ServeError::AdapterPathRefused {
                name: name.to_owned(),
            })
    }
}

/// An adapter name is a plain id (letters, digits, `._@:-`, not starting with a dot): never a
/// path, and one spelling per folder (`rv`, `rv/` and `rv/.` were three names for one).
pub fn check_name(name: &str) -> Result<(), ServeError> {
    let plain = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b':' | b'-'));
    if plain {
        Ok(())
    } else {
        Err(ServeError::BadRequest(format!(
            "The lora adapter name {name:?} must be a plain id (letters, digits and ._@:-)."
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_folders_under_a_root_resolve_and_links_out_do_not() {
        let base = std::env::temp_dir().join(format!("adapter-roots-{}", std::process::id()));
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("acme@v1")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let _ = std::fs::remove_file(root.join("escape"));
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        let roots = AdapterRoots::new([root.clone()]);

        assert!(roots.resolve(&root.join("acme@v1")).is_some());
        for refused in [
            outside.clone(),
            root.join("escape"),
            root.join("../outside"),
            root.join("missing"),
            root.clone(),
            PathBuf::from("/etc"),
        ] {
            assert!(roots.resolve(&refused).is_none(), "{}", refused.display());
        }
        let missing = roots.check("x", &root.join("missing")).unwrap_err();
        let outside = roots.check("x", &outside).unwrap_err();
        let strip =
            |e: ServeError, path: &Path| e.to_string().replace(&path.display().to_string(), "P");
        assert_eq!(
            strip(missing, &root.join("missing")),
            strip(outside, &base.join("outside")),
            "a refusal says nothing about what exists"
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn adapter_names_are_plain_ids() {
        for name in ["acme@v3", "tenant-a@v17", "rv"] {
            assert!(check_name(name).is_ok(), "{name}");
        }
        for name in ["rv/", "rv/.", "../x", "/etc", "", ".hidden", "a b"] {
            assert!(check_name(name).is_err(), "{name}");
        }
    }
}
