//! The trainer's JSONL metrics log, read while the demo runs, as an operator would tail it: one
//! line per optimizer step of a tenant, one per publish, one per gate decision, one per
//! checkpoint.

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use clawback_trainer::gate::Decision;
use clawback_trainer::train::metrics::{OpdAdvantage, PublishReport, Signal};
use serde_json::Value;

/// One optimizer step of one tenant.
#[derive(Debug, Clone)]
pub struct StepLine {
    pub tenant: String,
    pub step: u64,
    pub reward_mean: Option<f64>,
    /// What its spans had to learn from: rewards, hints, both.
    pub signal: Signal,
    /// The hint-distillation advantage over its distilled tokens.
    pub opd: Option<OpdAdvantage>,
    /// The trainer's totals so far of what it left out, by reason (`dropped` and
    /// `samples_stats` of the line, merged).
    pub dropped: serde_json::Map<String, Value>,
}

impl StepLine {
    /// A total the trainer reports under `dropped` or `samples_stats`.
    pub fn dropped(&self, reason: &str) -> u64 {
        self.dropped
            .get(reason)
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }
}

/// What the log said so far.
#[derive(Debug, Default)]
pub struct TrainerLog {
    pub steps: Vec<StepLine>,
    pub publishes: Vec<PublishReport>,
    /// What the gate decided about each candidate version.
    pub gates: Vec<Decision>,
    /// Bytes already read.
    offset: u64,
}

impl TrainerLog {
    /// Reads the complete lines appended since the last look (a missing file is no news).
    pub fn read_new(&mut self, path: &Path) {
        let Ok(mut file) = std::fs::File::open(path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut reader = BufReader::new(file);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if !line.ends_with('\n') {
                // Half written: read it whole next time.
                break;
            }
            self.offset += line.len() as u64;
            if let Ok(value) = serde_json::from_str::<Value>(&line) {
                self.record(value);
            }
            line.clear();
        }
    }

    fn record(&mut self, mut value: Value) {
        if let Some(gate) = value.get("gate") {
            if let Ok(decision) = serde_json::from_value::<Decision>(gate.clone()) {
                self.gates.push(decision);
            }
            return;
        }
        if let Some(publish) = value.get("publish") {
            if let Ok(report) = serde_json::from_value::<PublishReport>(publish.clone()) {
                self.publishes.push(report);
            }
            return;
        }
        let Some(step) = value["step"].as_u64() else {
            return;
        };
        let mut dropped = serde_json::Map::new();
        for key in ["samples_stats", "dropped"] {
            if let Value::Object(totals) = value[key].take() {
                dropped.extend(totals);
            }
        }
        self.steps.push(StepLine {
            tenant: value["tenant"].as_str().unwrap_or_default().to_owned(),
            step,
            reward_mean: value["reward_mean"].as_f64(),
            signal: serde_json::from_value(value["signal"].take()).unwrap_or_default(),
            opd: serde_json::from_value(value["opd"].take()).ok(),
            dropped,
        });
    }

    /// Optimizer steps `tenant`'s adapter has taken.
    pub fn steps_of(&self, tenant: &str) -> u64 {
        self.lines_of(tenant).map(|s| s.step).max().unwrap_or(0)
    }

    /// `tenant`'s optimizer steps, in order.
    pub fn lines_of<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a StepLine> + 'a {
        self.steps.iter().filter(move |s| s.tenant == tenant)
    }

    /// Publishes of `tenant`'s versions, live or failed.
    pub fn publishes_of(&self, tenant: &str) -> u64 {
        self.publishes
            .iter()
            .filter(|p| p.tenant.as_str() == tenant)
            .count() as u64
    }

    /// `tenant`'s versions the trainer is done with: published (live or failed), or held back
    /// by its gate.
    pub fn decided_of(&self, tenant: &str) -> u64 {
        let held_back = self.gates_of(tenant).filter(|d| !d.promoted).count() as u64;
        self.publishes_of(tenant) + held_back
    }

    /// The gate's decisions about `tenant`'s candidates, in order.
    pub fn gates_of<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a Decision> + 'a {
        self.gates
            .iter()
            .filter(move |d| d.tenant.as_str() == tenant)
    }

    /// Versions that went live.
    pub fn live_publishes(&self) -> impl Iterator<Item = &PublishReport> {
        self.publishes.iter().filter(|p| p.error.is_none())
    }
}
