//! The simulated agents. Each round, every tenant runs one group of rollouts of one prompt,
//! concurrently: a rollout is opened through the sidecar's handshake API (as a rollout
//! orchestrator would), then the agent makes its call to the `base_url` it got, with its own
//! API key and `X-Clawback-Done: true`, half of them streamed. Calls are spread over the
//! sidecar replicas. A round starts once the trainer is at most [`Plan::lag`] rounds behind, so
//! the policy that serves it is recent, and the backend is restarted before the round asked for.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::sums;
use super::watch::{self, Observations};
use crate::chat::Talk;
use crate::files::RunDir;
use crate::processes::Process;
use crate::report::Requests;
use crate::{Backend, DemoTenant, BASE_MODEL};

/// What to play.
pub struct Plan {
    pub sidecars: Vec<String>,
    pub admin_token: String,
    pub tenants: Vec<DemoTenant>,
    pub rounds: u32,
    pub group_size: u32,
    pub restart_backend_at: Option<u32>,
    pub progress_every: Duration,
    /// The plugin whose rewards are read back (`letter_case`, `exact_answer`).
    pub plugin: &'static str,
    /// What a group asks: each tenant's prompts in turn, or a fresh sum (from this seed).
    pub sums: Option<u64>,
    pub talk: Talk,
    /// How many rounds the workload may run ahead of the trainer.
    pub lag: u32,
    /// How long a round waits for the trainer before it goes on anyway.
    pub patience: Duration,
}

/// One rollout the agents ran and got a whole answer for.
#[derive(Debug, Clone)]
pub struct Rollout {
    pub tenant: usize,
    pub round: u32,
    pub replica: usize,
    pub trajectory: String,
}

/// What the workload and the watcher found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rollouts: Vec<Rollout>,
    pub requests: Requests,
    pub observations: Observations,
    pub backend_restarts: u32,
    /// When the first and the last round started, since the workload began.
    pub workload_seconds: f64,
}

/// Shared between the rounds' tasks and the watcher.
#[derive(Default)]
pub struct Shared {
    pub outcome: Outcome,
    pub round: u32,
}

pub type State = Arc<Mutex<Shared>>;

pub fn lock(state: &State) -> MutexGuard<'_, Shared> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Plays the plan; returns when every round has run and the trainer has caught up (or the
/// wait for it ran out).
pub async fn drive(
    plan: &Plan,
    run: &RunDir,
    backend: &mut Backend,
    trainer: &mut Process,
) -> Result<Outcome> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .context("building the HTTP client")?;
    let state: State = Arc::default();
    let started = Instant::now();
    let watcher = watch::spawn(
        client.clone(),
        plan,
        run.metrics(),
        Arc::clone(&state),
        started,
    );
    let result = rounds(plan, run, backend, trainer, &client, &state, started).await;
    let caught_up = match &result {
        Ok(()) => catch_up(plan, &client, trainer, &state).await,
        Err(_) => Ok(()),
    };
    watcher.finish(&client, plan, run, &state).await;
    result?;
    caught_up?;
    let mut shared = lock(&state);
    shared.outcome.backend_restarts = backend.restarts();
    Ok(std::mem::take(&mut shared.outcome))
}

async fn rounds(
    plan: &Plan,
    run: &RunDir,
    backend: &mut Backend,
    trainer: &mut Process,
    client: &reqwest::Client,
    state: &State,
    started: Instant,
) -> Result<()> {
    for round in 0..plan.rounds {
        pace(plan, round, client, trainer, state).await?;
        if plan.restart_backend_at == Some(round) {
            crate::say(&format!(
                "round {round}: killing the backend and starting it again"
            ));
            tokio::task::block_in_place(|| backend.restart(run))?;
            crate::say(&format!("backend back on {}", backend.url()));
        }
        {
            let mut shared = lock(state);
            shared.round = round;
            shared.outcome.workload_seconds = started.elapsed().as_secs_f64();
        }
        let mut groups = tokio::task::JoinSet::new();
        for (index, tenant) in plan.tenants.iter().enumerate() {
            let group = GroupCall {
                client: client.clone(),
                sidecars: plan.sidecars.clone(),
                admin_token: plan.admin_token.clone(),
                tenant: tenant.clone(),
                tenant_index: index,
                round,
                size: plan.group_size,
                sums: plan.sums,
                talk: plan.talk,
            };
            let state = Arc::clone(state);
            groups.spawn(async move { group.run(&state).await });
        }
        while let Some(joined) = groups.join_next().await {
            joined.context("a rollout group panicked")?;
        }
    }
    Ok(())
}

/// Waits until the trainer is done with every tenant's groups up to `round - plan.lag`.
async fn pace(
    plan: &Plan,
    round: u32,
    client: &reqwest::Client,
    trainer: &mut Process,
    state: &State,
) -> Result<()> {
    let wanted = u64::from(round.saturating_sub(plan.lag));
    if !trainer_done_with(plan, wanted, client, trainer, state).await? {
        crate::say(&format!(
            "round {round}: the trainer is more than {} rounds behind after {:?}; going on",
            plan.lag, plan.patience
        ));
    }
    Ok(())
}

/// After the last round: waits (bounded) until the trainer is done with (nearly) every group.
async fn catch_up(
    plan: &Plan,
    client: &reqwest::Client,
    trainer: &mut Process,
    state: &State,
) -> Result<()> {
    // The last rollouts' completions make their groups ready first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let wanted = u64::from(plan.rounds.saturating_sub(1));
    trainer_done_with(plan, wanted, client, trainer, state).await?;
    Ok(())
}

/// Waits up to `plan.patience` until the trainer is done with `wanted` groups of every tenant —
/// or with everything ready, when groups it dropped for equal rewards left no optimizer step to
/// count; whether it got there. An error if the trainer exits.
async fn trainer_done_with(
    plan: &Plan,
    wanted: u64,
    client: &reqwest::Client,
    trainer: &mut Process,
    state: &State,
) -> Result<bool> {
    let since = Instant::now();
    loop {
        if !trainer.running() {
            bail!("the trainer exited: {}", trainer.tail());
        }
        let counted = {
            let shared = lock(state);
            plan.tenants
                .iter()
                .all(|t| shared.outcome.observations.groups_done(&t.name) >= wanted)
        };
        let idle = || async {
            crate::backlog::backlog(client, &plan.sidecars[0])
                .await
                .is_some_and(|b| b.lag + b.pending == 0)
        };
        if counted || idle().await {
            return Ok(true);
        }
        if since.elapsed() > plan.patience {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One tenant's group of one round.
struct GroupCall {
    client: reqwest::Client,
    sidecars: Vec<String>,
    admin_token: String,
    tenant: DemoTenant,
    tenant_index: usize,
    round: u32,
    size: u32,
    sums: Option<u64>,
    talk: Talk,
}

impl GroupCall {
    async fn run(&self, state: &State) {
        let (prompt, answer) = match self.sums {
            Some(seed) => {
                let stream = sums::stream(seed, self.tenant_index);
                let problem = sums::problem(stream, u64::from(self.round));
                (problem.question, Some(problem.answer))
            }
            None => {
                let prompts = self.tenant.prompts;
                (
                    prompts[self.round as usize % prompts.len()].to_owned(),
                    None,
                )
            }
        };
        let group_id = format!("{}-round-{}", self.tenant.name, self.round);
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..self.size {
            let replica = (self.round as usize + i as usize) % self.sidecars.len();
            let call = Call {
                client: self.client.clone(),
                sidecar: self.sidecars[replica].clone(),
                admin_token: self.admin_token.clone(),
                tenant: self.tenant.clone(),
                group_id: group_id.clone(),
                group_size: self.size,
                round: self.round,
                prompt: prompt.clone(),
                answer: answer.clone(),
                talk: self.talk,
                stream: i % 2 == 1,
            };
            calls.spawn(async move { (replica, call.run().await) });
        }
        while let Some(joined) = calls.join_next().await {
            let (replica, result) = match joined {
                Ok(done) => done,
                Err(e) => (0, Err(format!("the call's task failed: {e}"))),
            };
            let mut shared = lock(state);
            let outcome = &mut shared.outcome;
            outcome
                .requests
                .count(&result, || format!("round {}", self.round));
            if let Ok(trajectory) = result {
                outcome.rollouts.push(Rollout {
                    tenant: self.tenant_index,
                    round: self.round,
                    replica,
                    trajectory,
                });
            }
        }
    }
}

/// One rollout: opened by the orchestrator, answered through the agent's call.
struct Call {
    client: reqwest::Client,
    sidecar: String,
    admin_token: String,
    tenant: DemoTenant,
    group_id: String,
    group_size: u32,
    round: u32,
    prompt: String,
    /// The problem's answer: trusted metadata the orchestrator gives the handshake.
    answer: Option<String>,
    talk: Talk,
    stream: bool,
}

impl Call {
    /// The trajectory id, once the agent got a whole answer.
    async fn run(self) -> Result<String, String> {
        let opened: Value = self
            .client
            .post(format!("{}/trajectories", self.sidecar))
            .bearer_auth(&self.admin_token)
            .json(&json!({
                "tenant": self.tenant.name,
                "group_id": self.group_id,
                "group_size": self.group_size,
                "metadata": match &self.answer {
                    Some(answer) => json!({"round": self.round, "prompt": self.prompt, "answer": answer}),
                    None => json!({"round": self.round, "prompt": self.prompt}),
                },
            }))
            .send()
            .await
            .map_err(|e| format!("handshake: {e}"))?
            .error_for_status()
            .map_err(|e| format!("handshake: {e}"))?
            .json()
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let (Some(trajectory), Some(base_url)) = (
            opened["trajectory_id"].as_str(),
            opened["base_url"].as_str(),
        ) else {
            return Err(format!("handshake answered {opened}"));
        };
        let request = self
            .client
            .post(format!("{base_url}/chat/completions"))
            .bearer_auth(&self.tenant.key)
            .header("x-clawback-done", "true")
            .json(&json!({
                "model": BASE_MODEL,
                "messages": self.talk.opening(&self.prompt),
                "max_tokens": self.talk.sampling.max_tokens,
                "temperature": self.talk.sampling.temperature,
                "top_p": self.talk.sampling.top_p,
                "stream": self.stream,
            }));
        let body = crate::chat::success_body(request, "chat completion").await?;
        if self.stream {
            check_stream(&body)?;
        } else {
            let reply: Value =
                serde_json::from_str(&body).map_err(|e| format!("chat completion: {e}"))?;
            if reply["choices"][0]["message"]["content"].as_str().is_none() {
                return Err(format!("chat completion without content: {body}"));
            }
        }
        Ok(trajectory.to_owned())
    }
}

/// A streamed answer is whole: chunks, no error event, `[DONE]` at the end.
fn check_stream(body: &str) -> Result<(), String> {
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data:")) {
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let event: Value =
            serde_json::from_str(data).map_err(|e| format!("stream event {data:?}: {e}"))?;
        if event.get("error").is_some() {
            return Err(format!("stream error event: {data}"));
        }
    }
    if done {
        Ok(())
    } else {
        Err("the stream ended without [DONE]".to_owned())
    }
}
