//! The training loop: for each tenant, read ready deliveries through the consumer group, load
//! their trajectories, score them into samples, step the tenant's optimizer, report, checkpoint,
//! and ack what the checkpoint holds.
//!
//! A checkpoint is written every `checkpoint.every` optimizer steps, and also whenever a
//! tenant's ready queue runs dry with steps not yet checkpointed: an unacked delivery is handed
//! to another trainer after `consumer.claim_idle`, so what was consumed must not wait long for
//! its ack. On SIGINT/SIGTERM the loop finishes the step in progress, checkpoints every tenant
//! with unsaved steps, acks, and returns; samples still queued are left unacked and come back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawback_datapool::{
    Consumer, DeliveryId, LocalStore, PolicyVersion, ReadyItem, RedisConfig, RedisStore,
    RollbackOutcome, Store, TenantId, TrajectoryRecord, UnixMs,
};
use tokio::runtime::Runtime;

use crate::gate::{Decision, Gate, GateError};
use crate::publish::{PublishError, Published, Publisher};
use crate::sampler::EngineDefaults;
use crate::train::canary::Trial;
use crate::train::config::{Tenants, TrainConfig};
use crate::train::error::TrainError;
use crate::train::metrics::{Metrics, PublishReport};
use crate::train::tenant::{score_options, TenantTrainer};
use crate::train::text::TextCodec;
use clawback_model::lora::LoraAdapter;
use clawback_model::model::Model;

/// The embedded store's file inside a data directory: the sidecar's `store::LOCAL_FILE`.
pub const LOCAL_FILE: &str = "clawback.sqlite3";

/// How often the tenant list is looked up again when training "all".
const TENANT_REFRESH: Duration = Duration::from_secs(30);

/// How the loop ends besides a signal.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Return once nothing is ready, nothing is queued and everything is checkpointed and acked
    /// (a batch job over what the datapool holds now).
    pub exit_when_idle: bool,
    /// Stop on SIGINT/SIGTERM (the command line); tests stop through the flag instead.
    pub handle_signals: bool,
}

/// What a run did, per tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub optimizer_steps: BTreeMap<TenantId, u64>,
    pub acked: BTreeMap<TenantId, usize>,
    /// Versions made live, per tenant (with `[publish]`).
    pub published: BTreeMap<TenantId, u64>,
}

/// Opens the datapool `spec` names: a Redis URL, or the embedded store (a data directory or
/// the SQLite file). A missing embedded store is an error rather than a new, empty one.
pub async fn open_store(spec: &str) -> Result<Arc<dyn Store>, TrainError> {
    if spec.starts_with("redis://") || spec.starts_with("rediss://") {
        let store = RedisStore::connect(&RedisConfig::single(spec))
            .await
            .map_err(TrainError::datapool("connect"))?;
        return Ok(Arc::new(store));
    }
    let path = std::path::Path::new(spec);
    let file = if path.is_dir() {
        path.join(LOCAL_FILE)
    } else {
        path.to_path_buf()
    };
    if !file.is_file() {
        return Err(TrainError::NoDatapool(file.display().to_string()));
    }
    Ok(Arc::new(
        LocalStore::open(&file).map_err(TrainError::datapool("open"))?,
    ))
}

/// Runs the loop until `stop` is set, a signal arrives (with `handle_signals`), or — with
/// `exit_when_idle` — nothing is left to do.
pub fn run(
    config: &TrainConfig,
    options: RunOptions,
    stop: Arc<AtomicBool>,
) -> Result<Summary, TrainError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(TrainError::Runtime)?;
    if options.handle_signals {
        let flag = Arc::clone(&stop);
        rt.spawn(async move {
            wait_for_signal().await;
            flag.store(true, Ordering::SeqCst);
        });
    }
    if let Some(threads) = config.threads {
        tch::set_num_threads(threads);
    }
    let store = rt.block_on(open_store(&config.datapool))?;
    let publisher = config
        .publish
        .clone()
        .map(|c| Publisher::new(c, Arc::clone(&store)))
        .transpose()
        .map_err(|e| TrainError::Publisher(e.to_string()))?;
    let placement = config.placement()?;
    let model = Model::load(&config.model, placement).map_err(|source| TrainError::Model {
        path: config.model.display().to_string(),
        source,
    })?;
    let text = TextCodec::load(&config.model);
    let gate = match (&config.gate, &config.publish) {
        (Some(gate), Some(publish)) => {
            if text.is_none() {
                return Err(GateError::NoText.into());
            }
            Some(Gate::load(gate.clone(), &rt, &publish.adapter_root)?)
        }
        _ => None,
    };
    let engine_defaults = config.sampler.engine_defaults(&config.model)?;
    if config.metrics.progress {
        println!(
            "sampler: engine defaults {}; recorded logprobs are {:?}",
            engine_defaults.describe(),
            config.sampler.logprobs
        );
    }
    let metrics = Metrics::new(
        config.metrics.progress,
        config.metrics.jsonl.as_deref(),
        config.metrics.prometheus,
    )?;
    let mut lp = Loop {
        config,
        rt: &rt,
        store: store.as_ref(),
        model: &model,
        text: text.as_ref(),
        engine_defaults,
        metrics,
        consumer: Consumer {
            group: config.consumer.group.clone(),
            name: config.consumer.name.clone(),
            claim_idle: config.consumer.claim_idle,
            max_deliveries: config.consumer.max_deliveries,
        },
        base_model: config.model.display().to_string(),
        trainers: BTreeMap::new(),
        publisher,
        gate,
        trials: BTreeMap::new(),
        summary: Summary::default(),
        exit_when_idle: options.exit_when_idle,
    };
    let outcome = lp.run(options, &stop);
    // Whatever ended the loop, make what was trained durable and ack it.
    let flushed = lp.flush_all();
    outcome.and(flushed)?;
    Ok(lp.summary)
}

async fn wait_for_signal() {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The longest pause between attempts while the datapool is unreachable.
const OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(5);

struct Loop<'a> {
    config: &'a TrainConfig,
    rt: &'a Runtime,
    store: &'a dyn Store,
    model: &'a Model,
    text: Option<&'a TextCodec>,
    engine_defaults: EngineDefaults,
    metrics: Metrics,
    consumer: Consumer,
    base_model: String,
    trainers: BTreeMap<TenantId, TenantTrainer>,
    publisher: Option<Publisher>,
    gate: Option<Gate>,
    /// Canaries on trial, per tenant (with `[publish.canary]`).
    trials: BTreeMap<TenantId, Trial>,
    summary: Summary,
    /// A batch job does not wait `batch.max_wait` for a fuller step: it trains what is there.
    exit_when_idle: bool,
}

impl Loop<'_> {
    /// Rounds until `stop`; an unreachable datapool is waited out (with a growing pause, at
    /// most [`OUTAGE_BACKOFF_MAX`]), any other failure ends the loop.
    fn run(&mut self, options: RunOptions, stop: &AtomicBool) -> Result<(), TrainError> {
        let mut backoff = self.config.poll_interval;
        while !stop.load(Ordering::SeqCst) {
            match self.rounds(options, stop) {
                Ok(()) => return Ok(()),
                Err(e) if e.is_transient() => {
                    eprintln!("clawback-trainer: {e}; trying again in {backoff:?}");
                    let until = Instant::now() + backoff;
                    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    backoff = (backoff * 2).min(OUTAGE_BACKOFF_MAX);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn rounds(&mut self, options: RunOptions, stop: &AtomicBool) -> Result<(), TrainError> {
        let mut tenants: Vec<TenantId> = Vec::new();
        let mut looked_up: Option<Instant> = None;
        while !stop.load(Ordering::SeqCst) {
            match &self.config.tenants {
                Tenants::List(list) => tenants.clone_from(list),
                Tenants::All => {
                    if looked_up.is_none_or(|t| t.elapsed() >= TENANT_REFRESH) {
                        tenants = self
                            .rt
                            .block_on(self.store.tenants())
                            .map_err(TrainError::datapool("tenant list"))?;
                        looked_up = Some(Instant::now());
                    }
                }
            }
            let mut busy = false;
            for tenant in &tenants {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                busy |= self.tenant_round(tenant, stop)?;
            }
            if !busy {
                if options.exit_when_idle {
                    return Ok(());
                }
                // Nothing ready anywhere: wait, in slices, so a stop is seen promptly.
                let until = Instant::now() + self.config.poll_interval;
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50).min(self.config.poll_interval));
                }
            }
        }
        Ok(())
    }

    /// One round for one tenant: read, ingest, step while enough is queued, checkpoint and ack.
    /// Returns whether anything happened.
    fn tenant_round(&mut self, tenant: &TenantId, stop: &AtomicBool) -> Result<bool, TrainError> {
        if !self.trainers.contains_key(tenant) {
            let (trainer, resume_acks) =
                TenantTrainer::open(tenant.clone(), self.model, self.config)?;
            self.trainers.insert(tenant.clone(), trainer);
            self.ack(tenant, resume_acks)?;
        }
        let rolled_back = self.roll_back(tenant)?;
        let deliveries = self
            .rt
            .block_on(self.store.read_ready(
                tenant,
                &self.consumer,
                self.config.consumer.read_count,
            ))
            .map_err(TrainError::datapool("read of the ready queue"))?;
        let idle = deliveries.is_empty();
        let mut busy = !idle || rolled_back;
        let live = self
            .rt
            .block_on(self.store.policy_version(tenant))
            .map_err(TrainError::datapool("policy version lookup"))?;
        self.follow_trial(tenant, live.as_ref());
        let current_version = live.map(|p| p.version);
        let weights = self.config.reward_weights(tenant);
        let options = score_options(
            self.config,
            self.engine_defaults,
            self.model.config().vocab_size,
            &weights,
            self.text,
            current_version,
        );
        for delivery in deliveries {
            let Some(trainer) = self.trainers.get_mut(tenant) else {
                break;
            };
            if trainer.is_in_flight(&delivery.id) {
                continue;
            }
            let loaded = load(self.rt, self.store, tenant, delivery.item)?;
            let Some(trainer) = self.trainers.get_mut(tenant) else {
                break;
            };
            match loaded {
                Some((records, is_group)) => {
                    if let Some(trial) = self.trials.get_mut(tenant) {
                        trial.count(&records, &weights);
                    }
                    trainer.ingest(delivery.id, &records, is_group, &options)
                }
                None => trainer.missing(delivery.id),
            }
        }

        let batch = &self.config.batch;
        let max_wait = if self.exit_when_idle {
            Duration::ZERO
        } else {
            batch.max_wait
        };
        while let Some(trainer) = self.trainers.get_mut(tenant) {
            if stop.load(Ordering::SeqCst) || !trainer.ready(batch.samples_per_step, max_wait, idle)
            {
                break;
            }
            busy = true;
            if let Some(report) = trainer.step(self.model, self.config)? {
                self.metrics.record(&report);
                *self
                    .summary
                    .optimizer_steps
                    .entry(tenant.clone())
                    .or_default() += 1;
            }
            if trainer.checkpoint_due(self.config.checkpoint.every) {
                self.checkpoint(tenant)?;
            }
        }
        busy |= self.judge_trial(tenant);
        if let Some(trainer) = self.trainers.get(tenant) {
            if idle
                && !trainer.has_queued()
                && (trainer.dirty() || trainer.ackable_without_checkpoint())
            {
                self.checkpoint(tenant)?;
                busy = true;
            }
        }
        Ok(busy)
    }

    /// Checkpoints `tenant`, acks what the checkpoint holds, and — when it holds new steps and
    /// publishing is configured — makes it the tenant's live version.
    fn checkpoint(&mut self, tenant: &TenantId) -> Result<(), TrainError> {
        let Some(trainer) = self.trainers.get_mut(tenant) else {
            return Ok(());
        };
        let new_steps = trainer.dirty();
        let (acks, written) = trainer.checkpoint(self.config, &self.base_model)?;
        if let Some(written) = &written {
            self.metrics.record_checkpoint(written);
        }
        self.ack(tenant, acks)?;
        if new_steps {
            self.publish(tenant);
        }
        Ok(())
    }

    /// Publishes the tenant's adapter as version `<optimizer steps>` once the gate (when one is
    /// configured) passed it. A failure is reported and training goes on: the previous version
    /// stays live and the next checkpoint tries again; so does a candidate the gate held back.
    fn publish(&mut self, tenant: &TenantId) {
        let (Some(publisher), Some(trainer)) = (&self.publisher, self.trainers.get(tenant)) else {
            return;
        };
        if self.trials.contains_key(tenant) {
            // One candidate on trial at a time: the next checkpoint after its decision is the
            // next candidate.
            return;
        }
        let version = trainer.optimizer_steps();
        let live = self
            .rt
            .block_on(self.store.policy_version(tenant))
            .ok()
            .flatten()
            .map(|p| p.version);
        if let (Some(gate), Some(text)) = (&mut self.gate, self.text) {
            if gate.applies_to(tenant) {
                let decided = gate.decide(
                    self.rt,
                    self.model,
                    text,
                    tenant,
                    version,
                    trainer.adapter(),
                    live.map(|v| (v, publisher.version_dir(tenant, v))),
                );
                let decision = match decided {
                    Ok(decision) => decision,
                    Err(e) => {
                        // Not judged is not passed: the live version keeps serving.
                        eprintln!("clawback-trainer: the gate could not judge {tenant}@v{version}: {e}; not published");
                        self.metrics.record_gate_failure(tenant);
                        return;
                    }
                };
                self.metrics.record_gate(&decision);
                // Kept for the operator (the viewer); not kept is reported, not fatal.
                if let Err(e) = self
                    .rt
                    .block_on(self.store.record_gate_decision(&decision.record()))
                {
                    eprintln!("clawback-trainer: the gate's decision on {tenant}@v{version} was not kept in the datapool: {e}");
                }
                if !decision.promoted {
                    self.hold_back(&decision);
                    return;
                }
            }
        }
        let (Some(publisher), Some(trainer)) = (&self.publisher, self.trainers.get(tenant)) else {
            return;
        };
        let write = |dir: &std::path::Path| trainer.save_adapter(dir, &self.base_model);
        if let (Some(rule), Some(live)) = (&publisher.config().canary, live) {
            let outcome =
                self.rt
                    .block_on(publisher.start_canary(tenant, version, rule.percent, write));
            if outcome.is_ok() {
                self.trials
                    .insert(tenant.clone(), Trial::new(live, version));
            }
            let report = PublishReport {
                // The policy it switched to is the live version's, with this one on trial.
                adapter: Publisher::adapter_name(tenant, version),
                ..PublishReport::of(tenant, version, &outcome)
            };
            self.metrics.record_trial(&report, rule.percent);
            return;
        }
        let outcome = self.rt.block_on(publisher.publish(tenant, version, write));
        self.report_publish(tenant, version, &outcome);
    }

    /// Keeps the trials in step with the tenant's policy: a canary the datapool shows and the
    /// loop does not know (a restart) is tried again from now; one it no longer shows (a
    /// rollback ended it) is forgotten.
    fn follow_trial(&mut self, tenant: &TenantId, live: Option<&PolicyVersion>) {
        let shown = live.and_then(|p| Some((p.version, p.canary.as_ref()?.version)));
        let known = self.trials.get(tenant).map(|t| (t.live, t.version));
        match shown {
            Some(_) if shown == known => {}
            Some((live, version)) if self.publisher.is_some() => {
                self.trials
                    .insert(tenant.clone(), Trial::new(live, version));
            }
            _ => {
                self.trials.remove(tenant);
            }
        }
    }

    /// Promotes or drops the tenant's canary once the rule decides; returns whether it did.
    fn judge_trial(&mut self, tenant: &TenantId) -> bool {
        let (Some(publisher), Some(trial)) = (&self.publisher, self.trials.get(tenant)) else {
            return false;
        };
        let decision = match &publisher.config().canary {
            Some(rule) => trial.judge(tenant, rule),
            // A canary left by a run configured with one: nothing to judge it by here.
            None => Some(trial.decided(
                tenant,
                false,
                "no [publish.canary] to judge it by".to_owned(),
            )),
        };
        let Some(decision) = decision else {
            return false;
        };
        let outcome = if decision.promoted {
            self.rt.block_on(publisher.promote(tenant))
        } else {
            self.rt.block_on(publisher.drop_canary(tenant))
        };
        match outcome {
            Ok(published) => {
                self.trials.remove(tenant);
                self.metrics.record_canary(&decision);
                if decision.promoted {
                    self.report_publish(tenant, decision.version, &Ok(published));
                }
                true
            }
            // The trial goes on; the next round tries again.
            Err(e) => {
                eprintln!(
                    "clawback-trainer: ending {tenant}'s canary v{} failed: {e}",
                    decision.version
                );
                false
            }
        }
    }

    fn report_publish(
        &mut self,
        tenant: &TenantId,
        version: u64,
        outcome: &Result<Published, PublishError>,
    ) {
        let report = PublishReport::of(tenant, version, outcome);
        if report.error.is_none() {
            *self.summary.published.entry(tenant.clone()).or_default() += 1;
        }
        self.metrics.record_publish(&report);
    }

    /// Carries out the operator's rollback order for `tenant` (placed through the sidecar's
    /// `POST /tenants/{tenant}/rollback`) if one waits, and records its outcome; returns
    /// whether one did. No gate judges it: the operator chose the version.
    fn roll_back(&mut self, tenant: &TenantId) -> Result<bool, TrainError> {
        let order = self
            .rt
            .block_on(self.store.rollback(tenant))
            .map_err(TrainError::datapool("rollback order lookup"))?;
        let Some(mut order) = order.filter(|o| o.outcome.is_none()) else {
            return Ok(false);
        };
        order.outcome = Some(match self.restore(tenant, order.to)? {
            Ok(version) => RollbackOutcome::Done {
                at: UnixMs::now(),
                version,
            },
            Err(reason) => RollbackOutcome::Failed {
                at: UnixMs::now(),
                reason,
            },
        });
        self.metrics.record_rollback(&order);
        self.rt
            .block_on(self.store.settle_rollback(&order))
            .map_err(TrainError::datapool("rollback outcome"))?;
        Ok(true)
    }

    /// Makes version `to` of `tenant` live again as a new version, and trains on from it.
    /// `Ok(Err(why))`: it could not, and the live version stays.
    fn restore(&mut self, tenant: &TenantId, to: u64) -> Result<Result<u64, String>, TrainError> {
        let (Some(publisher), Some(trainer)) = (&self.publisher, self.trainers.get(tenant)) else {
            return Ok(Err(
                "this trainer publishes nothing (its config has no [publish])".to_owned(),
            ));
        };
        if self.trials.contains_key(tenant) {
            // The operator goes back: the candidate on trial goes too.
            if let Err(e) = self.rt.block_on(publisher.drop_canary(tenant)) {
                return Ok(Err(format!(
                    "the canary on trial could not be dropped: {e}"
                )));
            }
            self.trials.remove(tenant);
        }
        let live = self
            .rt
            .block_on(self.store.policy_version(tenant))
            .map_err(TrainError::datapool("policy version lookup"))?;
        let Some(live) = live.filter(|live| to > 0 && to < live.version) else {
            return Ok(Err(format!(
                "version {to} is not an earlier version of {tenant}"
            )));
        };
        // Read before anything goes live: what cannot be trained on is not made live.
        let dir = publisher.version_dir(tenant, to);
        let placement = self.model.placement();
        let adapter = match LoraAdapter::load(&dir, self.model.config(), placement.device) {
            Ok(adapter) => adapter,
            Err(e) => {
                return Ok(Err(format!(
                    "cannot read version {to} in {}: {e}",
                    dir.display()
                )))
            }
        };
        let version = live.version.max(trainer.optimizer_steps()) + 1;
        let outcome = self.rt.block_on(publisher.restore(tenant, to, version));
        self.report_publish(tenant, version, &outcome);
        if let Err(e) = outcome {
            return Ok(Err(e.to_string()));
        }
        let Some(trainer) = self.trainers.get_mut(tenant) else {
            return Ok(Ok(version));
        };
        let acks = trainer.restore(adapter, version, self.config, &self.base_model)?;
        self.ack(tenant, acks)?;
        Ok(Ok(version))
    }

    /// Keeps a candidate the gate held back on disk, with its decision.
    fn hold_back(&self, decision: &Decision) {
        let (Some(gate), Some(trainer)) = (&self.gate, self.trainers.get(&decision.tenant)) else {
            return;
        };
        match gate.hold_back(decision, |dir| trainer.save_adapter(dir, &self.base_model)) {
            Ok(dir) => {
                if self.config.metrics.progress {
                    println!("held back: {}", dir.display());
                }
            }
            Err(e) => eprintln!("clawback-trainer: {e}"),
        }
    }

    fn ack(&mut self, tenant: &TenantId, acks: Vec<DeliveryId>) -> Result<(), TrainError> {
        if acks.is_empty() {
            return Ok(());
        }
        self.rt
            .block_on(self.store.ack(tenant, &self.consumer.group, &acks))
            .map_err(TrainError::datapool("ack"))?;
        *self.summary.acked.entry(tenant.clone()).or_default() += acks.len();
        Ok(())
    }

    /// Checkpoints every tenant with unsaved steps and acks what the checkpoints hold.
    fn flush_all(&mut self) -> Result<(), TrainError> {
        let tenants: Vec<TenantId> = self.trainers.keys().cloned().collect();
        for tenant in tenants {
            let Some(trainer) = self.trainers.get(&tenant) else {
                continue;
            };
            if trainer.dirty() || trainer.ackable_without_checkpoint() {
                self.checkpoint(&tenant)?;
            }
        }
        Ok(())
    }
}

/// The trajectories of a ready entry, and whether they are a group; `None` when it is gone.
fn load(
    rt: &Runtime,
    store: &dyn Store,
    tenant: &TenantId,
    item: ReadyItem,
) -> Result<Option<(Vec<TrajectoryRecord>, bool)>, TrainError> {
    let fetch = TrainError::datapool("trajectory fetch");
    match item {
        ReadyItem::Trajectory(id) => Ok(rt
            .block_on(store.trajectory(tenant, &id))
            .map_err(fetch)?
            .map(|r| (vec![r], false))),
        ReadyItem::Group(id) => {
            let Some(group) = rt
                .block_on(store.group(tenant, &id))
                .map_err(TrainError::datapool("group fetch"))?
            else {
                return Ok(None);
            };
            let mut records = Vec::with_capacity(group.finished.len());
            for member in &group.finished {
                let record = rt
                    .block_on(store.trajectory(tenant, member))
                    .map_err(TrainError::datapool("trajectory fetch"))?;
                records.extend(record);
            }
            Ok(Some((records, true)))
        }
    }
}
