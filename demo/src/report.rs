//! What both scenarios report at the end: the requests the agents made and how many failed,
//! how long publishing a version took, and how far apart the tenants' adapters ended up.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use clawback_trainer::train::metrics::PublishReport;
use serde::Serialize;
use tch::Tensor;

use crate::trainer_log::TrainerLog;

/// The agents' calls: served, failed, and the first few failures as the agent saw them.
#[derive(Debug, Default, Serialize)]
pub struct Requests {
    pub served: u64,
    pub failed: u64,
    pub failures: Vec<String>,
}

impl Requests {
    /// Counts one call; a failure's text is kept for the first few.
    pub fn count<T>(&mut self, result: &Result<T, String>, context: impl FnOnce() -> String) {
        match result {
            Ok(_) => self.served += 1,
            Err(failure) => {
                self.failed += 1;
                if self.failures.len() < 5 {
                    self.failures.push(format!("{}: {failure}", context()));
                }
            }
        }
    }

    /// `  requests: 640 served, 0 failed` and the failures kept.
    pub fn text(&self) -> String {
        let mut out = format!(
            "  requests: {} served, {} failed\n",
            self.served, self.failed
        );
        for failure in &self.failures {
            out.push_str(&format!("    {failure}\n"));
        }
        out
    }
}

/// Median and worst of each publishing phase, in seconds.
#[derive(Debug, Serialize)]
pub struct PublishTimes {
    pub save: (f64, f64),
    pub load: (f64, f64),
    pub switch: (f64, f64),
    pub total: (f64, f64),
}

impl PublishTimes {
    /// Over the versions that went live; `None` when none did.
    pub fn of(live: &[&PublishReport]) -> Option<Self> {
        (!live.is_empty()).then(|| {
            let times =
                |f: fn(&PublishReport) -> f64| median_and_max(live.iter().map(|p| f(p)).collect());
            PublishTimes {
                save: times(|p| p.save_seconds),
                load: times(|p| p.load_seconds),
                switch: times(|p| p.switch_seconds),
                total: times(|p| p.save_seconds + p.load_seconds + p.switch_seconds),
            }
        })
    }

    pub fn text(&self) -> String {
        format!(
            "  publish latency, median / max: save {:.3} / {:.3} s, load {:.3} / {:.3} s, \
             switch {:.3} / {:.3} s, all three {:.3} / {:.3} s\n",
            self.save.0,
            self.save.1,
            self.load.0,
            self.load.1,
            self.switch.0,
            self.switch.1,
            self.total.0,
            self.total.1
        )
    }
}

fn median_and_max(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
    (median, values.last().copied().unwrap_or(0.0))
}

/// The mean of `values`; `None` when there are none.
pub fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// Two tenants' last adapters, compared by their weight updates ΔW = B·A.
#[derive(Debug, Serialize)]
pub struct AdapterComparison {
    pub adapters: (String, String),
    /// cos(ΔW₁, ΔW₂) over all adapted modules.
    pub cosine: f64,
    /// ‖ΔW₁ − ΔW₂‖ / max(‖ΔW₁‖, ‖ΔW₂‖).
    pub relative_distance: f64,
}

impl AdapterComparison {
    /// The latest live adapters of tenants `a` and `b` (published under `root`); `None` when
    /// either has none.
    pub fn latest(root: &Path, log: &TrainerLog, a: &str, b: &str) -> Result<Option<Self>> {
        let latest = |tenant: &str| {
            log.live_publishes()
                .filter(|p| p.tenant.as_str() == tenant)
                .max_by_key(|p| p.version)
                .map(|p| p.adapter.clone())
        };
        match (latest(a), latest(b)) {
            (Some(a), Some(b)) => compare(root, a, b).map(Some),
            _ => Ok(None),
        }
    }

    pub fn text(&self) -> String {
        format!(
            "  adapters {} and {}: cos(ΔW, ΔW) = {:+.3}, relative distance {:.3}\n",
            self.adapters.0, self.adapters.1, self.cosine, self.relative_distance
        )
    }
}

/// Compares two published PEFT adapters under `root` by their ΔW = B·A.
fn compare(root: &Path, a: String, b: String) -> Result<AdapterComparison> {
    let delta = |name: &str| -> Result<Tensor> {
        let file = root.join(name).join("adapter_model.safetensors");
        let tensors: BTreeMap<String, Tensor> = Tensor::read_safetensors(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .into_iter()
            .collect();
        let mut parts = Vec::new();
        for (key, lora_a) in tensors.iter().filter(|(k, _)| k.contains("lora_A")) {
            let key_b = key.replace("lora_A", "lora_B");
            let lora_b = tensors
                .get(&key_b)
                .with_context(|| format!("{}: {key} without {key_b}", file.display()))?;
            parts.push(lora_b.matmul(lora_a).flatten(0, -1));
        }
        Ok(Tensor::cat(&parts, 0))
    };
    let (da, db) = (delta(&a)?, delta(&b)?);
    let norm = |t: &Tensor| t.norm().double_value(&[]);
    let (na, nb) = (norm(&da), norm(&db));
    let dot = (&da * &db).sum(tch::Kind::Double).double_value(&[]);
    let cosine = if na > 0.0 && nb > 0.0 {
        dot / (na * nb)
    } else {
        0.0
    };
    let relative_distance = norm(&(&da - &db)) / na.max(nb).max(f64::MIN_POSITIVE);
    Ok(AdapterComparison {
        adapters: (a, b),
        cosine,
        relative_distance,
    })
}
