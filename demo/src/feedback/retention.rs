//! Answers kept: what a tenant's users could lose while the loop teaches the form they asked
//! for. Each tenant's live model is asked the short factual questions of the gate's shipped
//! retention set (`trainer/gate/retention.jsonl`, written apart from the scenario's bank)
//! greedily, through a sidecar with the tenant's key, as side turns (recorded, never trained
//! on); each reply is checked by the gate's own Wasm plugins, run here in the same sandbox:
//! `knows_answer` (the answer is in it) and `restates_question` (it gives the question back).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use clawback_filters::standalone::Standalone;
use clawback_filters::FiltersConfig;
use clawback_trainer::gate::prompts::{self, Prompt};
use serde::Serialize;

use crate::chat::{self, Sampling, Talk};
use crate::DemoTenant;

/// The shipped retention set, also written into the run for the trainer's gate.
pub const RETENTION: &str = include_str!("../../../trainer/gate/retention.jsonl");
/// The shipped preference set (everyday requests, apart from the bank), for the gate.
pub const PREFERENCE: &str = include_str!("../../../trainer/gate/preference.jsonl");

/// Greedy, as the gate reads a version: what the model answers when it is surest.
const GREEDY: Sampling = Sampling {
    max_tokens: 48,
    temperature: 0.0,
    top_p: 1.0,
};

/// One probing of a tenant's answers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Kept {
    /// The adapter version that answered most of them; 0 for the base model.
    pub version: u64,
    pub asked: usize,
    /// Replies that hold the known answer.
    pub answered: usize,
    /// Replies that give the question back.
    pub restated: usize,
}

/// The two checks and the questions.
pub struct Checks {
    knows: Standalone,
    restates: Arc<Standalone>,
    questions: Vec<Prompt>,
}

impl Checks {
    /// Loads the plugins from `plugins` and the questions from the run's copy of the set.
    pub async fn load(plugins: &Path, questions: &Path) -> Result<Self> {
        let load = |name: &str| {
            let path = plugins.join(format!("{name}.wasm"));
            async move {
                Standalone::load(&path, FiltersConfig::default())
                    .await
                    .with_context(|| format!("loading {}", path.display()))
            }
        };
        Ok(Checks {
            knows: load("knows_answer").await?,
            restates: Arc::new(load("restates_question").await?),
            questions: prompts::load(questions)?,
        })
    }

    /// The `restates_question` check, for the simulated users.
    pub fn restates(&self) -> Arc<Standalone> {
        Arc::clone(&self.restates)
    }

    /// Asks `tenant`'s live model every question through `sidecar`, concurrently; what its
    /// replies kept, and the failures as the caller saw them.
    pub async fn probe(
        &self,
        client: &reqwest::Client,
        sidecar: &str,
        tenant: &DemoTenant,
    ) -> (Kept, Vec<String>) {
        let talk = Talk {
            system: None,
            sampling: GREEDY,
        };
        let mut calls = tokio::task::JoinSet::new();
        for (i, question) in self.questions.iter().enumerate() {
            let messages = talk.opening(&question.prompt);
            let (client, base_url, key) =
                (client.clone(), format!("{sidecar}/v1"), tenant.key.clone());
            calls.spawn(async move {
                let headers = [("x-turn-type", "side"), ("x-clawback-done", "true")];
                let reply =
                    chat::complete(&client, &base_url, &key, &messages, GREEDY, &headers).await;
                (i, reply)
            });
        }
        let mut versions = std::collections::BTreeMap::<u64, usize>::new();
        let (mut kept, mut failures) = (Kept::default(), Vec::new());
        while let Some(joined) = calls.join_next().await {
            let (i, reply) = match joined {
                Ok((i, Ok(reply))) => (i, reply),
                Ok((_, Err(failure))) => {
                    failures.push(failure);
                    continue;
                }
                Err(e) => {
                    failures.push(format!("a retention probe's task failed: {e}"));
                    continue;
                }
            };
            let question = &self.questions[i];
            kept.asked += 1;
            *versions.entry(reply.version()).or_default() += 1;
            let knows = sign(&self.knows, &tenant.name, question, &reply.content).await;
            let restates = sign(&self.restates, &tenant.name, question, &reply.content).await;
            kept.answered += usize::from(knows == Some(true));
            kept.restated += usize::from(restates == Some(false));
        }
        kept.version = chat::most_common_version(versions);
        (kept, failures)
    }
}

/// Whether `reply` gives `question` back instead of answering it, by the `restates_question`
/// check (`false` when it has no opinion or its call failed: the user cannot tell).
pub async fn restates(check: &Standalone, tenant: &str, question: &str, reply: &str) -> bool {
    let called = check
        .run_reply(tenant, question, reply, &serde_json::Map::new())
        .await;
    called
        .result
        .ok()
        .and_then(|e| e.reward)
        .is_some_and(|r| r < 0.0)
}

/// Whether `check` scored `reply` to `question` above 0; `None` for no opinion or a failed call.
async fn sign(check: &Standalone, tenant: &str, question: &Prompt, reply: &str) -> Option<bool> {
    let called = check
        .run_reply(tenant, &question.prompt, reply, &question.metadata)
        .await;
    called.result.ok().and_then(|e| e.reward).map(|r| r > 0.0)
}
