//! The gate before a version goes live. A checkpoint that holds new optimizer steps is a
//! *candidate*; before it is published, the gate reads its greedy replies to the tenant's
//! prompt sets, scores each reply with the set's checks — Wasm plugins, the same ones that
//! score rewards in the sidecar — and compares the candidate with the version it would replace
//! (the live one, the base before the first) and with the base. A candidate that passes every
//! set's rule, and stays within `max_kl` of the base, is published; one that does not is held
//! back: the live version keeps serving, the candidate is kept on disk with the decision
//! beside it, and the decision goes to the trainer's report and metrics.
//!
//! Why: a reward checks one thing. On the real model, an adapter rewarded for "one short
//! sentence" learned to restate factual questions instead of answering them, and every
//! optimizer step went live. What a tenant's users may lose is measured here, before they meet
//! it.
//!
//! Cost: the base's replies are read once per process, the live version's once per version
//! (a promoted candidate's replies become the live ones'), the candidate's every time: greedy
//! generation of the tenant's prompts (those of one length batched together), and two forward
//! passes per prompt for the KL. Each decision reports its seconds and replies generated.
//!
//! | file | job |
//! |---|---|
//! | `config.rs` | the `[gate]` section |
//! | `prompts.rs` | a prompt set's JSON lines |
//! | `replies.rs` | greedy replies and the KL to the base, on the trainer's model |
//! | `rule.rs` | a set's rule: too few passed, and (with `significance`) unlikely by chance |

pub mod config;
pub mod prompts;
pub mod replies;
pub mod rule;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clawback_datapool::{GateDecision, GateSetScore, TenantId, UnixMs, SCHEMA_VERSION};
use clawback_filters::standalone::{Standalone, StandaloneError};
use clawback_model::lora::LoraAdapter;
use clawback_model::model::Model;
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;

pub use config::{GateSection, PromptSetConfig};
use prompts::{Prompt, PromptsError};
use replies::{RepliesError, Reply};

use crate::train::text::TextCodec;

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("invalid gate configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Prompts(#[from] PromptsError),
    #[error("the gate's check {name} ({path}): {source}")]
    Check {
        name: String,
        path: String,
        #[source]
        source: StandaloneError,
    },
    #[error("the gate needs the base model's tokenizer and chat template (tokenizer.json, tokenizer_config.json)")]
    NoText,
    #[error(transparent)]
    Replies(#[from] RepliesError),
    #[error("cannot load the live version's adapter {dir}: {source}")]
    Live {
        dir: String,
        #[source]
        source: clawback_model::lora::LoraError,
    },
    #[error("cannot keep the held-back candidate in {dir}: {problem}")]
    HoldBack { dir: String, problem: String },
}

/// How one version did on one check of a set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckCounts {
    /// Replies it scored above 0.
    pub passed: usize,
    /// Replies it scored below 0.
    pub failed: usize,
    /// Replies it had no opinion on.
    pub silent: usize,
    /// Calls that failed (a trap, its fuel): the reply counts as failed.
    pub errors: usize,
}

/// How one version did on one set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideScore {
    /// Prompts whose reply passed: some check above 0, none below.
    pub passed: usize,
    pub checks: BTreeMap<String, CheckCounts>,
    /// Whether each prompt's reply passed, in the set's order: which prompts a candidate lost.
    #[serde(default)]
    pub each: Vec<bool>,
}

/// One set's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetScore {
    pub name: String,
    pub prompts: usize,
    pub candidate: SideScore,
    /// The version it would replace (the base before the first version).
    pub live: SideScore,
    pub base: SideScore,
}

/// What the gate decided about one candidate, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub tenant: TenantId,
    pub version: u64,
    /// The live version it was compared with; `None`: the base.
    pub live: Option<u64>,
    pub promoted: bool,
    /// Why it was held back (empty when promoted).
    pub reasons: Vec<String>,
    /// What else the operator should know (a live version that could not be read, ...).
    pub notes: Vec<String>,
    pub sets: Vec<SetScore>,
    /// Mean per-token KL(candidate ‖ base) over the base's replies, in nats.
    pub kl: f64,
    /// Replies generated for this decision (the candidate's, and any not read before).
    pub generated: usize,
    pub seconds: f64,
}

impl Decision {
    /// What the datapool keeps of it, for the operator.
    pub fn record(&self) -> GateDecision {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        GateDecision {
            schema_version: SCHEMA_VERSION,
            tenant: self.tenant.clone(),
            version: self.version,
            live: self.live,
            promoted: self.promoted,
            reasons: self.reasons.clone(),
            sets: self
                .sets
                .iter()
                .map(|s| GateSetScore {
                    name: s.name.clone(),
                    prompts: count(s.prompts),
                    candidate: count(s.candidate.passed),
                    live: count(s.live.passed),
                    base: count(s.base.passed),
                })
                .collect(),
            kl: self.kl,
            seconds: self.seconds,
            decided_at: UnixMs::now(),
        }
    }

    /// The progress line.
    pub fn line(&self) -> String {
        let sets: Vec<String> = self
            .sets
            .iter()
            .map(|s| {
                format!(
                    "{} {}/{} (live {}, base {})",
                    s.name, s.candidate.passed, s.prompts, s.live.passed, s.base.passed
                )
            })
            .collect();
        let verdict = if self.promoted {
            "promoted".to_owned()
        } else {
            format!("held back: {}", self.reasons.join("; "))
        };
        format!(
            "gate {}@v{}: {}; {}; kl {:.4}; {:.1}s",
            self.tenant,
            self.version,
            sets.join(", "),
            verdict,
            self.kl,
            self.seconds
        )
    }
}

/// A prompt set, loaded.
struct Set {
    config: PromptSetConfig,
    prompts: Vec<Prompt>,
}

/// The gate, with what it has read of the base and the live versions.
pub struct Gate {
    config: GateSection,
    sets: Vec<Set>,
    checks: BTreeMap<String, Standalone>,
    held_back_dir: PathBuf,
    /// The base's replies, per set.
    base: HashMap<String, Vec<Reply>>,
    /// The live version's replies, per tenant: (version, per set).
    live: HashMap<TenantId, (u64, HashMap<String, Vec<Reply>>)>,
}

impl Gate {
    /// Loads the prompt sets and the check plugins. `adapter_root` is the publisher's: held-back
    /// candidates go under it unless `held_back_dir` says otherwise.
    pub fn load(config: GateSection, rt: &Runtime, adapter_root: &Path) -> Result<Self, GateError> {
        config.check().map_err(GateError::Config)?;
        let dir = config.filters.dir.clone().unwrap_or_default();
        let mut sets = Vec::with_capacity(config.sets.len());
        let mut checks = BTreeMap::new();
        for set in &config.sets {
            for name in &set.checks {
                if checks.contains_key(name) {
                    continue;
                }
                let path = dir.join(format!("{name}.wasm"));
                let check = rt
                    .block_on(Standalone::load(&path, config.filters.clone()))
                    .map_err(|source| GateError::Check {
                        name: name.clone(),
                        path: path.display().to_string(),
                        source,
                    })?;
                checks.insert(name.clone(), check);
            }
            sets.push(Set {
                prompts: prompts::load(&set.file)?,
                config: set.clone(),
            });
        }
        let held_back_dir = config
            .held_back_dir
            .clone()
            .unwrap_or_else(|| adapter_root.join("held-back"));
        Ok(Self {
            config,
            sets,
            checks,
            held_back_dir,
            base: HashMap::new(),
            live: HashMap::new(),
        })
    }

    /// Whether any set applies to `tenant`: a tenant with none goes live unchecked.
    pub fn applies_to(&self, tenant: &TenantId) -> bool {
        self.sets.iter().any(|s| s.config.applies_to(tenant))
    }

    /// Decides about `candidate`, version `version` of `tenant`, against the live version
    /// (`live`: its number and adapter folder; `None`: the base is live).
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &mut self,
        rt: &Runtime,
        model: &Model,
        text: &TextCodec,
        tenant: &TenantId,
        version: u64,
        candidate: &LoraAdapter,
        live: Option<(u64, PathBuf)>,
    ) -> Result<Decision, GateError> {
        let started = Instant::now();
        let max_new_tokens = self.config.max_new_tokens;
        let applying: Vec<usize> = (0..self.sets.len())
            .filter(|&i| self.sets[i].config.applies_to(tenant))
            .collect();
        let mut generated = 0;
        let mut notes = Vec::new();
        let read = |adapter: Option<&LoraAdapter>, set: &Set| -> Result<Vec<Reply>, GateError> {
            let prompts: Vec<&str> = set.prompts.iter().map(|p| p.prompt.as_str()).collect();
            Ok(replies::greedy(
                model,
                text,
                adapter,
                &prompts,
                max_new_tokens,
            )?)
        };
        for &i in &applying {
            let set = &self.sets[i];
            if !self.base.contains_key(&set.config.name) {
                let replies = read(None, set)?;
                generated += replies.len();
                self.base.insert(set.config.name.clone(), replies);
            }
        }
        // The live version's replies, read once per version.
        let live_version = live.as_ref().map(|(v, _)| *v);
        let cached = self
            .live
            .get(tenant)
            .is_some_and(|(v, _)| Some(*v) == live_version);
        if let (Some((number, dir)), false) = (&live, cached) {
            match LoraAdapter::load(dir, model.config(), model.placement().device) {
                Ok(adapter) => {
                    let mut by_set = HashMap::new();
                    for &i in &applying {
                        let set = &self.sets[i];
                        let replies = read(Some(&adapter), set)?;
                        generated += replies.len();
                        by_set.insert(set.config.name.clone(), replies);
                    }
                    self.live.insert(tenant.clone(), (*number, by_set));
                }
                Err(source) => {
                    // The live version's files are gone (or unreadable): compared with the base.
                    let error = GateError::Live {
                        dir: dir.display().to_string(),
                        source,
                    };
                    notes.push(format!("{error}; compared with the base"));
                    self.live.remove(tenant);
                }
            }
        }
        let live_replies = self
            .live
            .get(tenant)
            .filter(|(v, _)| Some(*v) == live_version)
            .map(|(_, by_set)| by_set);
        let compared_live = live_replies.is_some().then_some(live_version).flatten();

        let mut sets = Vec::new();
        let mut candidate_replies = HashMap::new();
        let mut reasons = Vec::new();
        let (mut kl_sum, mut kl_tokens) = (0.0, 0usize);
        for &i in &applying {
            let set = &self.sets[i];
            let name = &set.config.name;
            let mine = read(Some(candidate), set)?;
            generated += mine.len();
            let base_replies = &self.base[name];
            for reply in base_replies {
                let (kl, tokens) = replies::kl_along(model, candidate, reply)?;
                kl_sum += kl;
                kl_tokens += tokens;
            }
            let score = |replies: &[Reply]| self.score(rt, tenant, set, replies);
            let candidate_score = score(&mine);
            let base_score = score(base_replies);
            let live_score = match live_replies.and_then(|by_set| by_set.get(name)) {
                Some(replies) => score(replies),
                None => base_score.clone(),
            };
            let live_name =
                compared_live.map_or_else(|| "the base".to_owned(), |v| format!("v{v}"));
            let against = |other: &SideScore, other_name: &str, max_drop: usize| {
                rule::held_back(
                    name,
                    set.prompts.len(),
                    &candidate_score,
                    other,
                    other_name,
                    max_drop,
                    set.config.significance,
                )
            };
            reasons.extend(against(
                &live_score,
                &format!("the live version ({live_name})"),
                set.config.max_drop,
            ));
            if let Some(max_drop) = set.config.max_drop_from_base {
                reasons.extend(against(&base_score, "the base", max_drop));
            }
            sets.push(SetScore {
                name: name.clone(),
                prompts: set.prompts.len(),
                candidate: candidate_score,
                live: live_score,
                base: base_score,
            });
            candidate_replies.insert(name.clone(), mine);
        }
        let kl = if kl_tokens == 0 {
            0.0
        } else {
            kl_sum / kl_tokens as f64
        };
        if let Some(max_kl) = self.config.max_kl.filter(|max| kl > *max) {
            reasons.push(format!(
                "KL to the base {kl:.4} nats per token is over gate.max_kl = {max_kl}"
            ));
        }
        let promoted = reasons.is_empty();
        if promoted {
            // Its replies are the live version's from now on.
            self.live
                .insert(tenant.clone(), (version, candidate_replies));
        }
        Ok(Decision {
            tenant: tenant.clone(),
            version,
            live: compared_live,
            promoted,
            reasons,
            notes,
            sets,
            kl,
            generated,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Runs the set's checks on each reply, as `tenant`.
    fn score(&self, rt: &Runtime, tenant: &TenantId, set: &Set, replies: &[Reply]) -> SideScore {
        let mut side = SideScore::default();
        for (prompt, reply) in set.prompts.iter().zip(replies) {
            let (mut above, mut below) = (false, false);
            for name in &set.config.checks {
                let counts = side.checks.entry(name.clone()).or_default();
                let Some(check) = self.checks.get(name) else {
                    continue;
                };
                let called = rt.block_on(check.run_reply(
                    tenant.as_str(),
                    &prompt.prompt,
                    &reply.text,
                    &prompt.metadata,
                ));
                match called.result {
                    Ok(evaluation) => match evaluation.reward {
                        Some(r) if r > 0.0 => {
                            counts.passed += 1;
                            above = true;
                        }
                        Some(r) if r < 0.0 => {
                            counts.failed += 1;
                            below = true;
                        }
                        _ => counts.silent += 1,
                    },
                    Err(failure) => {
                        eprintln!(
                            "clawback-trainer: gate check {name} failed on a reply: {}",
                            failure.reason
                        );
                        counts.errors += 1;
                        below = true;
                    }
                }
            }
            side.passed += usize::from(above && !below);
            side.each.push(above && !below);
        }
        side
    }

    /// Keeps a held-back candidate for inspection: `<held_back_dir>/<tenant>@v<N>/`, the adapter
    /// `write` saves and the decision as `gate.json`. Returns the folder.
    pub fn hold_back<W, E>(&self, decision: &Decision, write: W) -> Result<PathBuf, GateError>
    where
        W: FnOnce(&Path) -> Result<(), E>,
        E: std::fmt::Display,
    {
        let dir = self
            .held_back_dir
            .join(format!("{}@v{}", decision.tenant, decision.version));
        let failed = |problem: String| GateError::HoldBack {
            dir: dir.display().to_string(),
            problem,
        };
        std::fs::create_dir_all(&dir).map_err(|e| failed(e.to_string()))?;
        write(&dir).map_err(|e| failed(e.to_string()))?;
        let json = serde_json::to_vec_pretty(decision).map_err(|e| failed(e.to_string()))?;
        std::fs::write(dir.join("gate.json"), json).map_err(|e| failed(e.to_string()))?;
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_datapool_keeps_each_sets_counts_and_the_reasons() {
        let side = |passed: usize| SideScore {
            passed,
            ..SideScore::default()
        };
        let decision = Decision {
            tenant: TenantId::new("acme").expect("a tenant"),
            version: 7,
            live: Some(4),
            promoted: false,
            reasons: vec!["retention: 7 of 40 passed".to_owned()],
            notes: Vec::new(),
            sets: vec![SetScore {
                name: "retention".to_owned(),
                prompts: 40,
                candidate: side(7),
                live: side(24),
                base: side(26),
            }],
            kl: 0.25,
            generated: 80,
            seconds: 12.5,
        };
        let record = decision.record();
        assert_eq!(
            (record.tenant.as_str(), record.version, record.live),
            ("acme", 7, Some(4))
        );
        assert!(!record.promoted);
        assert_eq!(record.reasons, decision.reasons);
        assert_eq!(
            record.sets,
            vec![GateSetScore {
                name: "retention".to_owned(),
                prompts: 40,
                candidate: 7,
                live: 24,
                base: 26,
            }]
        );
        assert_eq!((record.kl, record.seconds), (0.25, 12.5));
        assert_eq!(record.schema_version, SCHEMA_VERSION);
    }
}
