//! One arm of the feedback scenario, played against the running stack: each round, every
//! tenant's users hold their sessions (several at once, a few turns each) and go quiet; once the
//! sidecars have completed those sessions (idle) and the trainer has taken them (the datapool's
//! consumer lag is back to 0), the next round starts — so every round is served by a recent
//! policy. Probes measure each tenant's preferred-style rate before the first round, every few
//! rounds, and after the trainer has taken the last one.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;

use clawback_filters::standalone::Standalone;

use super::probe::{probe, ProbePoint};
use super::retention::restates;
use super::user::Session;
use crate::backlog::{backlog, Backlog};
use crate::chat::{self, Talk};
use crate::processes::Process;
use crate::report::Requests;
use crate::trainer_log::TrainerLog;
use crate::DemoTenant;

/// How often the trainer's log and the sidecar's lag are read.
const POLL: Duration = Duration::from_millis(250);

/// How much every arm plays and measures.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Schedule {
    pub rounds: u32,
    /// Users (sessions) per tenant and round (and samples per optimizer step).
    pub sessions: u32,
    /// Assistant turns per session.
    pub turns: u32,
    /// Probes per tenant every `probe_every` rounds, and before and after the run.
    pub probes: usize,
    pub final_probes: usize,
    pub probe_every: u32,
}

/// When the next round starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pacing {
    /// Once the trainer has been handed the round's sessions: it trains while the next round
    /// plays (a tiny model's steps take milliseconds).
    Handed,
    /// Once the trainer has trained, acked and published everything it was handed: each round
    /// is served by the policy the previous ones made, and serving and training take turns on
    /// the CPU instead of slowing each other down (a real model on two cores).
    Published,
}

impl Pacing {
    /// How long a round waits for the trainer before it goes on anyway: a real model's steps
    /// on a busy CPU take a minute and more.
    fn patience(self) -> Duration {
        match self {
            Pacing::Handed => Duration::from_secs(60),
            Pacing::Published => Duration::from_secs(600),
        }
    }
}

/// What to play.
pub struct Plan {
    pub arm: &'static str,
    pub sidecars: Vec<String>,
    pub tenants: Vec<DemoTenant>,
    pub schedule: Schedule,
    pub talk: Talk,
    pub pacing: Pacing,
    /// The trainer's JSONL metrics log.
    pub metrics: std::path::PathBuf,
    /// How long the sidecars wait before a quiet session is complete.
    pub idle: Duration,
    pub seed: u64,
    pub progress_every: Duration,
}

/// What one arm's run found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub requests: Requests,
    /// Per tenant: its probes, in order.
    pub points: Vec<Vec<ProbePoint>>,
    /// Per tenant and round: the users' replies that fitted their taste, and all of them.
    pub fitted: Vec<Vec<(u32, u32)>>,
    pub log: TrainerLog,
}

#[derive(Default)]
struct Shared {
    outcome: Outcome,
    round: u32,
}

type State = Arc<Mutex<Shared>>;

fn lock(state: &State) -> MutexGuard<'_, Shared> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Plays the plan; returns once the trainer has taken the last round and the last probes ran.
/// With `restates` (the `restates_question` check), a user corrects a reply that gives the
/// question back instead of answering it, whatever its form.
pub async fn drive(
    plan: &Plan,
    restates: Option<Arc<Standalone>>,
    trainer: &mut Process,
) -> Result<Outcome> {
    let client = reqwest::Client::builder()
        .build()
        .context("building the HTTP client")?;
    let state: State = Arc::default();
    {
        let mut shared = lock(&state);
        shared.outcome.points = vec![Vec::new(); plan.tenants.len()];
        shared.outcome.fitted = vec![Vec::new(); plan.tenants.len()];
    }
    let stop = Arc::new(tokio::sync::Notify::new());
    let watcher = tokio::spawn(
        Watch {
            tenants: plan.tenants.clone(),
            arm: plan.arm,
            rounds: plan.schedule.rounds,
            log: plan.metrics.clone(),
            every: plan.progress_every,
            started: Instant::now(),
        }
        .run(Arc::clone(&state), Arc::clone(&stop)),
    );
    let result = rounds(plan, restates, &client, &state, trainer).await;
    stop.notify_one();
    let _ = watcher.await;
    result?;
    let mut shared = lock(&state);
    shared.outcome.log.read_new(&plan.metrics);
    Ok(std::mem::take(&mut shared.outcome))
}

async fn rounds(
    plan: &Plan,
    restates: Option<Arc<Standalone>>,
    client: &reqwest::Client,
    state: &State,
    trainer: &mut Process,
) -> Result<()> {
    probe_all(plan, client, state, plan.schedule.final_probes).await;
    for round in 0..plan.schedule.rounds {
        lock(state).round = round;
        let mut sessions = tokio::task::JoinSet::new();
        for (tenant_index, tenant) in plan.tenants.iter().enumerate() {
            for user in 0..plan.schedule.sessions {
                let run = SessionRun {
                    client: client.clone(),
                    sidecars: plan.sidecars.clone(),
                    tenant: tenant.clone(),
                    tenant_index,
                    round,
                    user,
                    turns: plan.schedule.turns,
                    talk: plan.talk,
                    restates: restates.clone(),
                    first_question: (round * plan.schedule.sessions + user) as usize,
                    rng: StdRng::seed_from_u64(
                        plan.seed
                            ^ (u64::from(round) << 32 | u64::from(user) << 8)
                            ^ tenant_index as u64,
                    ),
                };
                let state = Arc::clone(state);
                sessions.spawn(async move { run.play(&state).await });
            }
        }
        while let Some(joined) = sessions.join_next().await {
            joined.context("a user's session panicked")?;
        }
        wait_for_trainer(plan, client, state, trainer).await?;
        let last = round + 1 == plan.schedule.rounds;
        if !last && (round + 1) % plan.schedule.probe_every.max(1) == 0 {
            probe_all(plan, client, state, plan.schedule.probes).await;
        }
    }
    probe_all(plan, client, state, plan.schedule.final_probes).await;
    Ok(())
}

/// One user's session of one round.
struct SessionRun {
    client: reqwest::Client,
    sidecars: Vec<String>,
    tenant: DemoTenant,
    tenant_index: usize,
    round: u32,
    user: u32,
    turns: u32,
    talk: Talk,
    restates: Option<Arc<Standalone>>,
    first_question: usize,
    rng: StdRng,
}

impl SessionRun {
    async fn play(mut self, state: &State) {
        let mut session = Session::new(
            self.tenant.prefers,
            &self.talk,
            self.tenant.prompts,
            self.first_question,
        );
        let (mut fitted, mut replies) = (0, 0);
        for turn in 0..self.turns {
            // A pool: the session's turns go to whichever replica, as behind a load balancer.
            let replica = (self.round + self.user + turn) as usize % self.sidecars.len();
            let base_url = format!("{}/v1", self.sidecars[replica]);
            let result = chat::complete(
                &self.client,
                &base_url,
                &self.tenant.key,
                session.messages(),
                self.talk.sampling,
                &[],
            )
            .await;
            lock(state).outcome.requests.count(&result, || {
                format!(
                    "{} round {} user {} turn {turn}",
                    self.tenant.name, self.round, self.user
                )
            });
            let Ok(reply) = result else {
                // The user gives up on this session; the trajectory ends when it goes idle.
                break;
            };
            replies += 1;
            let restated = match &self.restates {
                Some(check) => {
                    let asked = session.question_asked();
                    restates(check, &self.tenant.name, asked, &reply.content).await
                }
                None => false,
            };
            if session.reply(&reply.content, restated, &mut self.rng) {
                fitted += 1;
            }
        }
        let mut shared = lock(state);
        let per_round = &mut shared.outcome.fitted[self.tenant_index];
        let slot = self.round as usize;
        if per_round.len() <= slot {
            per_round.resize(slot + 1, (0, 0));
        }
        per_round[slot].0 += fitted;
        per_round[slot].1 += replies;
    }
}

/// Waits until the sidecars have completed the round's sessions (quiet for `plan.idle`) and the
/// trainer has been handed every ready one (the consumer group's lag is 0 in the first
/// sidecar's `/metrics`); it may still wait for more before it steps. With
/// [`Pacing::Published`], until nothing is pending either and every step it took is published
/// or held back by the trainer's gate.
async fn wait_for_trainer(
    plan: &Plan,
    client: &reqwest::Client,
    state: &State,
    trainer: &mut Process,
) -> Result<()> {
    // The idle sweep runs every quarter of the idle timeout; then the completion is journaled
    // and written.
    tokio::time::sleep(plan.idle + plan.idle / 2 + Duration::from_millis(250)).await;
    let since = Instant::now();
    let mut quiet = 0;
    let patience = plan.pacing.patience();
    while since.elapsed() < patience {
        if !trainer.running() {
            bail!("the trainer exited: {}", trainer.tail());
        }
        let settled = match (plan.pacing, backlog(client, &plan.sidecars[0]).await) {
            (Pacing::Handed, Some(Backlog { lag: 0, .. })) => true,
            (Pacing::Published, Some(Backlog { lag: 0, pending: 0 })) => {
                let mut shared = lock(state);
                let log = &mut shared.outcome.log;
                log.read_new(&plan.metrics);
                plan.tenants
                    .iter()
                    .all(|t| log.decided_of(&t.name) >= log.steps_of(&t.name))
            }
            _ => false,
        };
        quiet = if settled { quiet + 1 } else { 0 };
        if quiet >= 2 {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    crate::say(&format!(
        "{}: the trainer is not done with the round's sessions after {patience:?}; going on",
        plan.arm
    ));
    Ok(())
}

/// Probes every tenant, `n` calls each, concurrently.
async fn probe_all(plan: &Plan, client: &reqwest::Client, state: &State, n: usize) {
    let mut probes = tokio::task::JoinSet::new();
    for (index, tenant) in plan.tenants.iter().enumerate() {
        let (client, tenant) = (client.clone(), tenant.clone());
        let sidecar = plan.sidecars[index % plan.sidecars.len()].clone();
        let talk = plan.talk;
        probes.spawn(async move {
            let probed = probe(&client, &sidecar, &tenant, talk, n, None).await;
            (index, probed)
        });
    }
    while let Some(joined) = probes.join_next().await {
        let Ok((index, (point, failures))) = joined else {
            continue;
        };
        let mut shared = lock(state);
        let outcome = &mut shared.outcome;
        for failure in failures {
            outcome
                .requests
                .count::<()>(&Err(failure), || "probe".to_owned());
        }
        outcome.requests.served += point.probes as u64;
        outcome.points[index].push(point);
    }
}

/// Reads the trainer's log as it grows and prints a progress line every `every`.
struct Watch {
    tenants: Vec<DemoTenant>,
    arm: &'static str,
    rounds: u32,
    log: std::path::PathBuf,
    every: Duration,
    started: Instant,
}

impl Watch {
    async fn run(self, state: State, stop: Arc<tokio::sync::Notify>) {
        let mut last_line = Instant::now();
        loop {
            lock(&state).outcome.log.read_new(&self.log);
            if last_line.elapsed() >= self.every {
                last_line = Instant::now();
                eprintln!("{}", self.progress(&state));
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = stop.notified() => return,
            }
        }
    }

    /// `[  42s] opd round 5/12 | loud (upper) 0.31 → 0.58 at v5 | ... | 412 requests, 0 failed | 10 swaps`
    fn progress(&self, state: &State) -> String {
        let shared = lock(state);
        let outcome = &shared.outcome;
        let mut line = format!(
            "[{:>4.0}s] {} round {}/{}",
            self.started.elapsed().as_secs_f64(),
            self.arm,
            shared.round + 1,
            self.rounds
        );
        for (index, tenant) in self.tenants.iter().enumerate() {
            let points = &outcome.points[index];
            let rate = |p: Option<&ProbePoint>| {
                p.map_or("  -  ".to_owned(), |p| format!("{:.2}", p.rate()))
            };
            line.push_str(&format!(
                " | {} ({}) {} → {} at v{}",
                tenant.name,
                tenant.prefers.as_str(),
                rate(points.first()),
                rate(points.last()),
                outcome.log.steps_of(&tenant.name)
            ));
        }
        line.push_str(&format!(
            " | {} requests, {} failed | {} swaps",
            outcome.requests.served + outcome.requests.failed,
            outcome.requests.failed,
            outcome.log.live_publishes().count()
        ));
        line
    }
}
