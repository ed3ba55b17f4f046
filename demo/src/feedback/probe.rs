//! Probes: how often a tenant's live model answers in the tenant's taste with no hint and no
//! correction anywhere in its context — a fresh one-question conversation, sampled like the
//! users' calls. They go through a sidecar with the tenant's key, so its live adapter answers,
//! as side turns that end their trajectory (`x-turn-type: side`, `x-clawback-done`): recorded,
//! never trained on, never stitched into a user's session.

use serde::Serialize;

use crate::chat::{self, Talk};
use crate::DemoTenant;

/// The probes of one tenant at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct ProbePoint {
    /// The adapter version that answered most of them (the tenant's optimizer steps); 0 for
    /// the base model.
    pub version: u64,
    pub probes: usize,
    /// Answers in the tenant's preferred case.
    pub fitted: usize,
}

impl ProbePoint {
    pub fn rate(&self) -> f64 {
        self.fitted as f64 / self.probes.max(1) as f64
    }
}

/// `n` probes of `tenant` through `sidecar`, concurrently, over its probe questions in order
/// (so two probings of one size ask the same questions): what the answered ones found, and the
/// failures as the caller saw them. With a `hint`, it is appended to the question as the
/// trainer's teacher prompt has it: what the teacher of hint distillation would say.
pub async fn probe(
    client: &reqwest::Client,
    sidecar: &str,
    tenant: &DemoTenant,
    talk: Talk,
    n: usize,
    hint: Option<&str>,
) -> (ProbePoint, Vec<String>) {
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let question = tenant.probes[i % tenant.probes.len()];
        let question = match hint {
            Some(hint) => format!("{question}\n\n{hint}"),
            None => question.to_owned(),
        };
        let messages = talk.opening(&question);
        let (client, base_url, key) = (client.clone(), format!("{sidecar}/v1"), tenant.key.clone());
        calls.spawn(async move {
            let headers = [("x-turn-type", "side"), ("x-clawback-done", "true")];
            chat::complete(&client, &base_url, &key, &messages, talk.sampling, &headers).await
        });
    }
    let mut versions = std::collections::BTreeMap::<u64, usize>::new();
    let (mut answered, mut fitted, mut failures) = (0, 0, Vec::new());
    while let Some(joined) = calls.join_next().await {
        match joined.map_err(|e| format!("a probe's task failed: {e}")) {
            Ok(Ok(reply)) => {
                answered += 1;
                *versions.entry(reply.version()).or_default() += 1;
                fitted += usize::from(tenant.prefers.fits(&reply.content));
            }
            Ok(Err(failure)) | Err(failure) => failures.push(failure),
        }
    }
    let version = chat::most_common_version(versions);
    let point = ProbePoint {
        version,
        probes: answered,
        fitted,
    };
    (point, failures)
}
