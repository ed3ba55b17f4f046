//! Watching the loop from the outside, as an operator would: the rewards the plugin gave
//! (the sidecar's `GET /tenants/{t}/rewards`), the live adapter on every replica
//! (`GET /admin/policies`), and the trainer's optimizer steps and publishes (its JSONL
//! metrics log). A progress line goes to stderr as it changes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Notify;

use super::summary::round_means;
use super::workload::{lock, Plan, State};
use crate::files::RunDir;
use crate::report::mean;
use crate::trainer_log::TrainerLog;

/// How often the sidecars and the metrics log are read.
const POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
pub struct Observations {
    /// The plugin's reward per trajectory id.
    pub rewards: HashMap<String, f64>,
    /// The trainer's optimizer steps and publishes.
    pub log: TrainerLog,
    /// The round in which each version that went live was first seen, in order.
    pub swap_rounds: Vec<u32>,
    /// Per replica: tenant → live adapter.
    pub live: Vec<HashMap<String, String>>,
}

impl Observations {
    /// Groups of `tenant` the trainer is done with: each gave an optimizer step, or was
    /// dropped because its rewards were all equal (one group per step in the demo).
    pub fn groups_done(&self, tenant: &str) -> u64 {
        self.log.steps_of(tenant) + self.latest(tenant, "no_signal")
    }

    /// The trainer's latest total for `tenant` of what it left out for `reason`.
    pub fn latest(&self, tenant: &str, reason: &str) -> u64 {
        self.log
            .lines_of(tenant)
            .last()
            .map_or(0, |line| line.dropped(reason))
    }
}

pub struct Watcher {
    task: tokio::task::JoinHandle<()>,
    stop: Arc<Notify>,
}

pub fn spawn(
    client: reqwest::Client,
    plan: &Plan,
    log: PathBuf,
    state: State,
    started: Instant,
) -> Watcher {
    let stop = Arc::new(Notify::new());
    let sidecars = plan.sidecars.clone();
    let admin = plan.admin_token.clone();
    let plugin = plan.plugin;
    let tenants: Vec<String> = plan.tenants.iter().map(|t| t.name.clone()).collect();
    let every = plan.progress_every;
    let rounds = plan.rounds;
    let prefs: Vec<&'static str> = plan.tenants.iter().map(|t| t.prefers.as_str()).collect();
    let stopped = Arc::clone(&stop);
    let task = tokio::spawn(async move {
        let mut last_line = Instant::now();
        loop {
            poll(&client, &sidecars, &admin, plugin, &tenants, &log, &state).await;
            if last_line.elapsed() >= every {
                last_line = Instant::now();
                eprintln!("{}", progress(&state, &tenants, &prefs, rounds, started));
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = stopped.notified() => return,
            }
        }
    });
    Watcher { task, stop }
}

impl Watcher {
    /// Stops watching after a last look, once the last evaluations had time to land.
    pub async fn finish(self, client: &reqwest::Client, plan: &Plan, run: &RunDir, state: &State) {
        self.stop.notify_one();
        let _ = self.task.await;
        let tenants: Vec<String> = plan.tenants.iter().map(|t| t.name.clone()).collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        poll(
            client,
            &plan.sidecars,
            &plan.admin_token,
            plan.plugin,
            &tenants,
            &run.metrics(),
            state,
        )
        .await;
    }
}

async fn poll(
    client: &reqwest::Client,
    sidecars: &[String],
    admin: &str,
    plugin: &str,
    tenants: &[String],
    log: &std::path::Path,
    state: &State,
) {
    let mut rewards = Vec::new();
    if let Some(first) = sidecars.first() {
        for tenant in tenants {
            let url = format!("{first}/tenants/{tenant}/rewards?limit=200");
            if let Some(body) = get_json(client, &url, admin).await {
                rewards.extend(plugin_rewards(&body, plugin));
            }
        }
    }
    let mut live = Vec::new();
    for sidecar in sidecars {
        let body = get_json(client, &format!("{sidecar}/admin/policies"), admin).await;
        live.push(body.map(|b| live_adapters(&b)));
    }
    let mut shared = lock(state);
    let round = shared.round;
    let obs = &mut shared.outcome.observations;
    obs.rewards.extend(rewards);
    obs.live.resize(sidecars.len(), HashMap::new());
    for (slot, found) in obs.live.iter_mut().zip(live) {
        if let Some(found) = found {
            *slot = found;
        }
    }
    obs.log.read_new(log);
    let swaps = obs.log.live_publishes().count();
    obs.swap_rounds.resize(swaps, round);
}

async fn get_json(client: &reqwest::Client, url: &str, admin: &str) -> Option<Value> {
    let response = client.get(url).bearer_auth(admin).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// `(trajectory, reward)` of `plugin`'s points in a rewards listing.
fn plugin_rewards(body: &Value, plugin: &str) -> Vec<(String, f64)> {
    body["points"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["source"].as_str() == Some(plugin))
        .filter_map(|p| Some((p["trajectory"].as_str()?.to_owned(), p["reward"].as_f64()?)))
        .collect()
}

/// tenant → adapter from `GET /admin/policies`.
fn live_adapters(body: &Value) -> HashMap<String, String> {
    body["policies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p["tenant"].as_str()?.to_owned(),
                p["adapter"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// `[  42s] round 12/40 | loud (upper) reward -0.02 → 0.31 live loud@v11 | ... | 192 requests, 0 failed | 21 swaps`
fn progress(
    state: &State,
    tenants: &[String],
    prefs: &[&str],
    rounds: u32,
    started: Instant,
) -> String {
    let shared = lock(state);
    let outcome = &shared.outcome;
    let mut line = format!(
        "[{:>4.0}s] round {}/{}",
        started.elapsed().as_secs_f64(),
        shared.round + 1,
        rounds
    );
    for (index, tenant) in tenants.iter().enumerate() {
        let means: Vec<f64> = round_means(outcome, index)
            .into_iter()
            .filter_map(|r| r.mean)
            .collect();
        let first = mean(means.iter().take(2).copied());
        let recent = mean(means.iter().rev().take(2).copied());
        let live = outcome
            .observations
            .live
            .first()
            .and_then(|l| l.get(tenant))
            .map_or("base", String::as_str);
        let fmt = |v: Option<f64>| v.map_or_else(|| "  -  ".to_owned(), |v| format!("{v:+.2}"));
        line.push_str(&format!(
            " | {tenant} ({}) reward {} → {} live {live}",
            prefs.get(index).copied().unwrap_or("?"),
            fmt(first),
            fmt(recent)
        ));
    }
    let swaps = outcome.observations.log.live_publishes().count();
    line.push_str(&format!(
        " | {} requests, {} failed | {swaps} swaps",
        outcome.requests.served + outcome.requests.failed,
        outcome.requests.failed
    ));
    line
}
