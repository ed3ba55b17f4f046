//! A tenant's checkpoints: everything needed to continue training exactly where it stopped,
//! and the record of which deliveries it holds so they can be acked.
//!
//! ```text
//! <checkpoint.dir>/<tenant>/step-00000012/
//!     adapter/               the LoRA adapter in PEFT format (what vLLM / SGLang load)
//!     optimizer.safetensors  AdamW's moments
//!     state.json             CheckpointState: optimizer steps, applied steps, SeenSteps, deliveries
//! ```
//!
//! A checkpoint is written into a hidden temporary folder beside its final name and renamed
//! into place once complete, so a crash never leaves a half-written `step-*` folder: the latest
//! `step-*` is always whole. Leftover temporary folders are removed on the next start.

use std::path::{Path, PathBuf};

use clawback_datapool::{DeliveryId, StepId, TenantId, UnixMs};
use serde::{Deserialize, Serialize};
use tch::Device;

use crate::optim::{OptimError, Optimizer};
use crate::samples::SeenSteps;
use clawback_model::config::ModelConfig;
use clawback_model::lora::{LoraAdapter, LoraError};

const STATE_FILE: &str = "state.json";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const ADAPTER_DIR: &str = "adapter";
const PREFIX: &str = "step-";
const TEMP_PREFIX: &str = ".tmp-step-";

/// What went wrong writing or reading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint state {path} is unreadable: {source}")]
    State {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("checkpoint adapter: {0}")]
    Adapter(#[from] LoraError),
    #[error("checkpoint optimizer: {0}")]
    Optimizer(#[from] OptimError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `state.json`: the bookkeeping that makes a restart neither lose nor repeat data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    pub tenant: TenantId,
    /// Optimizer steps taken, this checkpoint's included (also the schedule's position).
    pub optimizer_steps: u64,
    /// The step AdamW's moments started from: 0, or where a rollback restarted them.
    #[serde(default)]
    pub moments_from: u64,
    /// The steps whose gradients went into the optimizer steps since the previous checkpoint.
    pub applied_steps: Vec<StepId>,
    /// The deliveries consumed since the previous checkpoint: acked once this one is written.
    pub deliveries: Vec<DeliveryId>,
    /// Every step applied so far (bounded), so a redelivery after a restart is dropped.
    pub seen: SeenSteps,
    pub created_at: UnixMs,
}

/// A checkpoint found on disk.
#[derive(Debug, Clone)]
pub struct Saved {
    pub dir: PathBuf,
    pub state: CheckpointState,
}

impl Saved {
    /// The PEFT adapter folder of this checkpoint.
    pub fn adapter_dir(&self) -> PathBuf {
        self.dir.join(ADAPTER_DIR)
    }

    /// Loads the adapter onto `device`.
    pub fn load_adapter(
        &self,
        model: &ModelConfig,
        device: Device,
    ) -> Result<LoraAdapter, CheckpointError> {
        Ok(LoraAdapter::load(&self.adapter_dir(), model, device)?)
    }

    /// Restores the optimizer's moments and step count (build it over the loaded adapter).
    pub fn restore_optimizer(&self, optimizer: &mut Optimizer) -> Result<(), CheckpointError> {
        optimizer.load_state(
            &self.dir.join(OPTIMIZER_FILE),
            self.state.optimizer_steps,
            self.state.moments_from,
        )?;
        Ok(())
    }
}

/// One tenant's checkpoint folder.
#[derive(Debug, Clone)]
pub struct TenantCheckpoints {
    dir: PathBuf,
}

impl TenantCheckpoints {
    /// `root/<tenant>`, created if missing; temporary folders a crash left behind are removed.
    pub fn open(root: &Path, tenant: &TenantId) -> Result<Self, CheckpointError> {
        let dir = root.join(tenant.as_str());
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                let path = entry.path();
                std::fs::remove_dir_all(&path).map_err(io(&path))?;
            }
        }
        Ok(TenantCheckpoints { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every whole checkpoint, oldest first.
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            let step = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(step) = step {
                out.push((step, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The newest checkpoint, if any.
    pub fn latest(&self) -> Result<Option<Saved>, CheckpointError> {
        match self.list()?.pop() {
            Some((_, dir)) => Ok(Some(read_state(&dir)?)),
            None => Ok(None),
        }
    }

    /// Writes a checkpoint atomically and removes all but the newest `keep_last` (0 keeps all).
    pub fn write(
        &self,
        state: &CheckpointState,
        adapter: &LoraAdapter,
        optimizer: &Optimizer,
        base_model: Option<&str>,
        keep_last: usize,
    ) -> Result<PathBuf, CheckpointError> {
        let name = format!("{:08}", state.optimizer_steps);
        let temp = self
            .dir
            .join(format!("{TEMP_PREFIX}{name}-{}", std::process::id()));
        let last = self.dir.join(format!("{PREFIX}{name}"));
        std::fs::create_dir_all(&temp).map_err(io(&temp))?;
        adapter.save(&temp.join(ADAPTER_DIR), base_model)?;
        optimizer.save_state(&temp.join(OPTIMIZER_FILE))?;
        let state_path = temp.join(STATE_FILE);
        let json = serde_json::to_vec(state).map_err(|source| CheckpointError::State {
            path: state_path.display().to_string(),
            source,
        })?;
        std::fs::write(&state_path, json).map_err(io(&state_path))?;
        sync_tree(&temp)?;
        if last.exists() {
            // Only when an operator rolled back to an older checkpoint and left newer ones in
            // place: the run that continues from the rollback replaces them.
            std::fs::remove_dir_all(&last).map_err(io(&last))?;
        }
        std::fs::rename(&temp, &last).map_err(io(&last))?;
        // The rename itself must be durable before deliveries are acked against it.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))?;
        if keep_last > 0 {
            let all = self.list()?;
            for (_, old) in all.iter().take(all.len().saturating_sub(keep_last)) {
                std::fs::remove_dir_all(old).map_err(io(old))?;
            }
        }
        Ok(last)
    }
}

/// Reads the `state.json` of a checkpoint folder.
pub fn read_state(dir: &Path) -> Result<Saved, CheckpointError> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read(&path).map_err(io(&path))?;
    let state = serde_json::from_slice(&text).map_err(|source| CheckpointError::State {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Saved {
        dir: dir.to_path_buf(),
        state,
    })
}

/// fsyncs every file under `dir` and the folders themselves.
fn sync_tree(dir: &Path) -> Result<(), CheckpointError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io(&path))?;
        }
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::AdamWConfig;
    use crate::schedule::{Decay, LrSchedule};
    use clawback_model::lora::LoraConfig;
    use clawback_model::test_support::tiny_config;

    fn parts() -> (LoraAdapter, Optimizer) {
        let adapter = LoraAdapter::new(&tiny_config(), LoraConfig::default(), Device::Cpu)
            .unwrap_or_else(|e| panic!("{e}"));
        let schedule = LrSchedule {
            peak_lr: 1e-3,
            min_lr: 0.0,
            warmup_steps: 1,
            total_steps: 10,
            decay: Decay::Constant,
        };
        let optimizer = Optimizer::new(adapter.var_store(), AdamWConfig::default(), schedule)
            .unwrap_or_else(|e| panic!("{e}"));
        (adapter, optimizer)
    }

    fn state(tenant: &TenantId, steps: u64) -> CheckpointState {
        CheckpointState {
            tenant: tenant.clone(),
            optimizer_steps: steps,
            moments_from: 0,
            applied_steps: vec![StepId::new()],
            deliveries: vec![DeliveryId(format!("{steps}-0"))],
            seen: SeenSteps::new(16),
            created_at: UnixMs(1),
        }
    }

    #[test]
    fn the_latest_whole_checkpoint_is_found_and_leftovers_of_a_crash_are_removed() {
        let root = std::env::temp_dir().join(format!("ckpt-{}", std::process::id()));
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        let cps = TenantCheckpoints::open(&root, &tenant).unwrap_or_else(|e| panic!("{e}"));
        let (adapter, optimizer) = parts();
        for steps in [2, 10, 4] {
            cps.write(
                &state(&tenant, steps),
                &adapter,
                &optimizer,
                Some("base"),
                0,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        // A crash mid-write leaves only a hidden temporary folder, never a step-* one.
        let half = cps.dir().join(format!("{TEMP_PREFIX}00000011-1"));
        std::fs::create_dir_all(half.join(ADAPTER_DIR)).unwrap_or_else(|e| panic!("{e}"));

        let cps = TenantCheckpoints::open(&root, &tenant).unwrap_or_else(|e| panic!("{e}"));
        assert!(!half.exists());
        let latest = cps.latest().unwrap_or_else(|e| panic!("{e}"));
        let latest = latest.unwrap_or_else(|| panic!("no checkpoint"));
        assert_eq!(latest.state, state(&tenant, 10).clone_with(&latest.state));
        assert!(latest.adapter_dir().join("adapter_config.json").is_file());
        let loaded = latest
            .load_adapter(&tiny_config(), Device::Cpu)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.config().rank, adapter.config().rank);

        cps.write(&state(&tenant, 12), &adapter, &optimizer, None, 2)
            .unwrap_or_else(|e| panic!("{e}"));
        let kept: Vec<u64> = cps
            .list()
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(kept, vec![10, 12]);
        let _ = std::fs::remove_dir_all(&root);
    }

    impl CheckpointState {
        /// `self` with the random parts (step ids) taken from `other`, to compare the rest.
        fn clone_with(&self, other: &CheckpointState) -> CheckpointState {
            CheckpointState {
                applied_steps: other.applied_steps.clone(),
                ..self.clone()
            }
        }
    }
}
