//! One tenant's training state over the shared frozen base: its adapter and optimizer, the
//! samples waiting for a step, and the bookkeeping that ties deliveries to checkpoints.
//!
//! **Exactly once, across crashes.** Two sets of step ids are kept: `handed_out` (every step
//! made into a sample by this process, so a delivery that comes back while its first copy is
//! still queued is not trained twice) and `applied` (only the steps an optimizer step used).
//! `applied` is what a checkpoint stores: after a restart, a step that was handed out but not
//! checkpointed is not in it and is trained when its unacked delivery comes back, while a step
//! in the checkpoint is dropped as a duplicate. A delivery is acked only after the checkpoint
//! holding its data is on disk.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use clawback_datapool::{DeliveryId, StepId, TenantId, TrajectoryRecord, UnixMs};
use tch::{Kind, Tensor};

use crate::losses::{
    combined_advantages, opd_advantages, policy_loss, token_logprobs, AdvantageSource,
    AdvantageWeights, LossConfig, PolicyBatch,
};
use crate::optim::Optimizer;
use crate::sampler::EngineDefaults;
use crate::samples::{SampleOptions, SampleStats, SeenSteps};
use crate::scoring::{completion_logprobs, Teacher};
use crate::train::advantages::{score_delivery, Dropped, ScoreOptions, Scored};
use crate::train::batch::{plan, MicroBatch};
use crate::train::checkpoint::{CheckpointState, TenantCheckpoints};
use crate::train::config::TrainConfig;
use crate::train::error::TrainError;
use crate::train::metrics::{Agreement, CheckpointReport, OpdAdvantage, Signal, StepReport};
use crate::train::text::TextCodec;
use clawback_model::lora::{LoraAdapter, LoraError};
use clawback_model::model::Model;

/// The scored samples of one delivery, waiting for an optimizer step.
struct Queued {
    delivery: DeliveryId,
    samples: Vec<Scored>,
    since: Instant,
}

/// A tenant's adapter, optimizer and queue.
pub struct TenantTrainer {
    tenant: TenantId,
    adapter: LoraAdapter,
    optimizer: Optimizer,
    checkpoints: TenantCheckpoints,
    handed_out: SeenSteps,
    applied: SeenSteps,
    queue: VecDeque<Queued>,
    /// Deliveries read and not yet acked: a redelivery of one of them is skipped.
    in_flight: HashSet<DeliveryId>,
    /// Consumed since the last checkpoint (trained, or nothing to train): acked after the next.
    consumed: Vec<DeliveryId>,
    applied_since_checkpoint: Vec<StepId>,
    steps_since_checkpoint: u64,
    stats: SampleStats,
    dropped: Dropped,
}

/// What to ack after a checkpoint (or at once, when nothing changed since the last one).
pub type Acks = Vec<DeliveryId>;

impl TenantTrainer {
    /// Resumes from the tenant's latest checkpoint, or starts a fresh adapter. Returns the
    /// trainer and the deliveries the latest checkpoint holds (to ack again: the process may
    /// have died between writing it and acking).
    pub fn open(
        tenant: TenantId,
        model: &Model,
        config: &TrainConfig,
    ) -> Result<(Self, Acks), TrainError> {
        let checkpoints = TenantCheckpoints::open(&config.checkpoint.dir, &tenant)?;
        let device = model.placement().device;
        let latest = checkpoints.latest()?;
        let (adapter, applied, resume_acks) = match &latest {
            Some(saved) => (
                saved.load_adapter(model.config(), device)?,
                saved.state.seen.clone(),
                saved.state.deliveries.clone(),
            ),
            None => (
                LoraAdapter::new(model.config(), config.lora_config(), device)?,
                SeenSteps::new(config.batch.seen_capacity),
                Vec::new(),
            ),
        };
        let mut optimizer =
            Optimizer::new(adapter.var_store(), config.adamw(), config.lr_schedule())?;
        if let Some(saved) = &latest {
            saved.restore_optimizer(&mut optimizer)?;
        }
        Ok((
            TenantTrainer {
                tenant,
                adapter,
                optimizer,
                checkpoints,
                handed_out: applied.clone(),
                applied,
                queue: VecDeque::new(),
                in_flight: HashSet::new(),
                consumed: Vec::new(),
                applied_since_checkpoint: Vec::new(),
                steps_since_checkpoint: 0,
                stats: SampleStats::default(),
                dropped: Dropped::default(),
            },
            resume_acks,
        ))
    }

    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    pub fn optimizer_steps(&self) -> u64 {
        self.optimizer.steps()
    }

    /// Whether `delivery` is already read and not acked (a redelivery to skip).
    pub fn is_in_flight(&self, delivery: &DeliveryId) -> bool {
        self.in_flight.contains(delivery)
    }

    /// Counts a ready entry whose trajectory or group was gone; it is consumed like any other.
    pub fn missing(&mut self, delivery: DeliveryId) {
        self.dropped.missing += 1;
        self.in_flight.insert(delivery.clone());
        self.consumed.push(delivery);
    }

    /// Scores a delivery's trajectories and queues its samples.
    pub fn ingest(
        &mut self,
        delivery: DeliveryId,
        records: &[TrajectoryRecord],
        is_group: bool,
        options: &ScoreOptions<'_>,
    ) {
        self.in_flight.insert(delivery.clone());
        let samples = score_delivery(
            records,
            is_group,
            options,
            &mut self.handed_out,
            &mut self.stats,
            &mut self.dropped,
        );
        if samples.is_empty() {
            self.consumed.push(delivery);
        } else {
            self.queue.push_back(Queued {
                delivery,
                samples,
                since: Instant::now(),
            });
        }
    }

    fn queued_samples(&self) -> usize {
        self.queue.iter().map(|q| q.samples.len()).sum()
    }

    /// Whether an optimizer step should run now: enough samples, or (when nothing more is
    /// ready) the oldest has waited `max_wait`.
    pub fn ready(&self, samples_per_step: usize, max_wait: Duration, idle: bool) -> bool {
        let queued = self.queued_samples();
        queued >= samples_per_step
            || (idle
                && queued > 0
                && self
                    .queue
                    .front()
                    .is_some_and(|q| q.since.elapsed() >= max_wait))
    }

    /// Whether a step waits for more samples.
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// One optimizer step over whole deliveries from the front of the queue, at least
    /// `samples_per_step` samples when that many are queued. `None` when nothing in them had a
    /// token to learn from (they are consumed all the same).
    pub fn step(
        &mut self,
        model: &Model,
        config: &TrainConfig,
    ) -> Result<Option<StepReport>, TrainError> {
        let started = Instant::now();
        let mut items: Vec<Scored> = Vec::new();
        let mut deliveries = Vec::new();
        while items.len() < config.batch.samples_per_step {
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            deliveries.push(q.delivery);
            items.extend(q.samples);
        }
        let report = self.train_on(model, config, &items, started);
        // Whatever happened, the gradients of an unfinished step must not leak into the next.
        if report.is_err() {
            self.optimizer.zero_grad();
        }
        let mut report = report?;
        if let Some(report) = &mut report {
            for item in &items {
                for step in &item.sample.step_ids {
                    self.applied.insert(*step);
                    self.applied_since_checkpoint.push(*step);
                    report.trained_steps.push(*step);
                }
            }
            self.steps_since_checkpoint += 1;
        }
        self.consumed.extend(deliveries);
        Ok(report)
    }

    fn train_on(
        &mut self,
        model: &Model,
        config: &TrainConfig,
        items: &[Scored],
        started: Instant,
    ) -> Result<Option<StepReport>, TrainError> {
        let device = model.placement().device;
        let lengths: Vec<usize> = items.iter().map(|s| s.sample.len()).collect();
        let groups = plan(&lengths, config.batch.micro_batch_tokens);
        let teacher_adapter = match config.teacher() {
            Teacher::FrozenBase => None,
            Teacher::CurrentPolicy => Some(&self.adapter),
        };
        let mut batches = Vec::with_capacity(groups.len());
        // The weights trained now are published, when they are, as this version.
        let current_version = self.optimizer.steps();
        for group in &groups {
            let rows: Vec<&Scored> = group.iter().map(|&i| &items[i]).collect();
            let mb = MicroBatch::build(
                &rows,
                device,
                current_version,
                |prompt, completion, sampler| {
                    let to_i64 = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
                    let lp = completion_logprobs(
                        model,
                        teacher_adapter,
                        &to_i64(prompt),
                        &to_i64(completion),
                        sampler,
                    )?;
                    Vec::<f32>::try_from(&lp.to_kind(Kind::Float).to_device(tch::Device::Cpu))
                        .map_err(TrainError::Torch)
                },
            )?;
            if mb.counted_tokens > 0 {
                batches.push(mb);
            }
        }
        let total: usize = batches.iter().map(|b| b.counted_tokens).sum();
        if total == 0 {
            return Ok(None);
        }
        let loss_config = config.loss_config();
        let weights = config.advantage_weights();
        let mut acc = Accumulated::default();
        for mb in &batches {
            let share = mb.counted_tokens as f64 / total as f64;
            self.micro_step(model, mb, &loss_config, weights, share, &mut acc)?;
        }
        let stats = self.optimizer.apply();
        let seconds = started.elapsed().as_secs_f64();
        let rewards: Vec<f64> = items.iter().filter_map(|s| s.reward).collect();
        let tokens: usize = batches.iter().map(|b| b.real_tokens).sum();
        let (adv_mean, adv_std) = acc.advantage.mean_std().unwrap_or((0.0, 0.0));
        let opd = acc.opd.mean_std().map(|(mean, std)| OpdAdvantage {
            tokens: acc.opd.count as u64,
            mean,
            std,
        });
        let mut signal = Signal::default();
        for item in items {
            for (advantage, teacher) in item.advantages.iter().zip(&item.teacher_prompts) {
                let (rewarded, hinted) = (advantage.is_some(), teacher.is_some());
                signal.spans += 1;
                signal.rewarded += u64::from(rewarded);
                signal.hinted += u64::from(hinted);
                signal.both += u64::from(rewarded && hinted);
            }
        }
        Ok(Some(StepReport {
            tenant: self.tenant.clone(),
            step: self.optimizer.steps(),
            lr: stats.lr,
            loss: acc.loss,
            clip_fraction: acc.clip_fraction,
            ratio_mean: acc.ratio_mean,
            kl: acc.kl,
            entropy: acc.entropy,
            grad_norm: stats.grad_norm,
            reward_mean: (!rewards.is_empty())
                .then(|| rewards.iter().sum::<f64>() / rewards.len() as f64),
            advantage_mean: adv_mean,
            advantage_std: adv_std,
            signal,
            opd,
            samples: items.len(),
            micro_batches: batches.len(),
            loss_tokens: total,
            tokens,
            tokens_per_second: tokens as f64 / seconds.max(1e-9),
            seconds,
            agreement: acc.agreement(),
            outside_support: acc.outside_support as u64,
            samples_stats: self.stats,
            dropped: self.dropped,
            trained_steps: Vec::new(),
        }))
    }

    /// Forward, loss and backward of one micro-batch, its loss scaled by its share of the
    /// step's tokens so the accumulated gradient is the token-mean over the whole step.
    fn micro_step(
        &mut self,
        model: &Model,
        mb: &MicroBatch,
        loss_config: &LossConfig,
        weights: AdvantageWeights,
        share: f64,
        acc: &mut Accumulated,
    ) -> Result<(), TrainError> {
        // The distribution each token was drawn from: the model's logits through its sampler.
        // A token the current policy's truncation would no longer keep has probability 0: it
        // leaves the loss (ratio 0, no gradient, KL undefined) and is counted.
        let (logits, in_support) =
            mb.sampled_logits(&model.forward(&mb.inputs, Some(&self.adapter), true)?);
        let current = tch::no_grad(|| token_logprobs(&logits.detach(), &mb.targets));
        let behaviour = if mb.needs_policy_behaviour {
            current.where_self(&mb.from_policy.gt(0.0), &mb.behaviour)
        } else {
            mb.behaviour.shallow_clone()
        };
        acc.observe_agreement(mb, &current, &in_support);
        let opd_adv = if mb.has_opd() {
            Some(opd_advantages(
                &mb.teacher,
                &behaviour,
                loss_config.opd_clip,
            )?)
        } else {
            None
        };
        let rl = AdvantageSource {
            advantages: &mb.rl_advantages,
            mask: &mb.rl_mask,
        };
        let opd = opd_adv.as_ref().map(|a| AdvantageSource {
            advantages: a,
            mask: &mb.opd_mask,
        });
        if let Some(opd) = &opd {
            acc.opd
                .add(opd.advantages, &(opd.mask * &mb.loss_mask * &in_support));
        }
        let Some((advantages, mask)) = combined_advantages(Some(rl), opd, weights) else {
            return Ok(());
        };
        let mask = mask * &mb.loss_mask * &in_support;
        let reference = if loss_config.kl_coef > 0.0 {
            let base = tch::no_grad(|| model.forward(&mb.inputs, None, false))?;
            Some(tch::no_grad(|| {
                token_logprobs(&mb.sampled_logits(&base).0, &mb.targets)
            }))
        } else {
            None
        };
        let batch = PolicyBatch {
            logits: &logits,
            tokens: &mb.targets,
            behaviour_logprobs: &behaviour,
            advantages: &advantages,
            mask: &mask,
            reference_logprobs: reference.as_ref(),
        };
        let (loss, m) = policy_loss(&batch, loss_config)?;
        let scaled = loss * share;
        acc.loss += scaled.double_value(&[]);
        self.optimizer.accumulate(&scaled);
        acc.clip_fraction += m.clip_fraction * share;
        acc.ratio_mean += m.ratio_mean * share;
        acc.kl += m.kl * share;
        acc.entropy += m.entropy * share;
        acc.advantage.add(&advantages, &mask);
        Ok(())
    }

    /// The adapter as trained so far.
    pub fn adapter(&self) -> &LoraAdapter {
        &self.adapter
    }

    /// Writes the adapter in PEFT format into `dir` (what a backend loads).
    pub fn save_adapter(&self, dir: &std::path::Path, base_model: &str) -> Result<(), LoraError> {
        self.adapter.save(dir, Some(base_model))
    }

    /// Continues from `adapter` (an earlier version's, read from its published folder) now that
    /// a rollback made it live as `version`: the optimizer goes on at step `version` (a version
    /// is the step count it was published at) with its moments restarted — they were gathered
    /// on the weights rolled back. Samples already queued stay queued. A checkpoint of the
    /// restored state is written at once, so a restart resumes from it and never from the
    /// versions rolled back; returns the deliveries it holds, to ack.
    pub fn restore(
        &mut self,
        adapter: LoraAdapter,
        version: u64,
        config: &TrainConfig,
        base_model: &str,
    ) -> Result<Acks, TrainError> {
        let mut optimizer =
            Optimizer::new(adapter.var_store(), config.adamw(), config.lr_schedule())?;
        optimizer.restart(version);
        self.adapter = adapter;
        self.optimizer = optimizer;
        // The steps since the last checkpoint went into the weights rolled back: their data
        // is consumed (acked with the checkpoint below), as the versions it made were.
        self.steps_since_checkpoint = 1;
        let (acks, _) = self.checkpoint(config, base_model)?;
        Ok(acks)
    }

    /// Whether a checkpoint is due (`every` steps since the last).
    pub fn checkpoint_due(&self, every: u64) -> bool {
        self.steps_since_checkpoint >= every
    }

    /// Writes a checkpoint when any step happened since the last one, and returns the
    /// deliveries that may now be acked: those whose data it holds, and those that had nothing
    /// to train. With no step since the last checkpoint, those are safe to ack at once.
    /// With the acks, what the checkpoint written holds (`None` when none was due).
    pub fn checkpoint(
        &mut self,
        config: &TrainConfig,
        base_model: &str,
    ) -> Result<(Acks, Option<CheckpointReport>), TrainError> {
        let mut written = None;
        if self.steps_since_checkpoint > 0 {
            let state = CheckpointState {
                tenant: self.tenant.clone(),
                optimizer_steps: self.optimizer.steps(),
                moments_from: self.optimizer.moments_from(),
                applied_steps: self.applied_since_checkpoint.clone(),
                deliveries: self.consumed.clone(),
                seen: self.applied.clone(),
                created_at: UnixMs::now(),
            };
            self.checkpoints.write(
                &state,
                &self.adapter,
                &self.optimizer,
                Some(base_model),
                config.checkpoint.keep_last,
            )?;
            written = Some(CheckpointReport {
                tenant: self.tenant.clone(),
                optimizer_steps: state.optimizer_steps,
                applied_steps: std::mem::take(&mut self.applied_since_checkpoint),
            });
            self.steps_since_checkpoint = 0;
        }
        let acks = std::mem::take(&mut self.consumed);
        for id in &acks {
            self.in_flight.remove(id);
        }
        Ok((acks, written))
    }

    /// Deliveries consumed without a step since the last checkpoint: ackable without writing one.
    pub fn ackable_without_checkpoint(&self) -> bool {
        self.steps_since_checkpoint == 0 && !self.consumed.is_empty()
    }

    /// Whether steps happened since the last checkpoint.
    pub fn dirty(&self) -> bool {
        self.steps_since_checkpoint > 0
    }
}

/// Sum, sum of squares and count of a per-token value over the tokens of a mask.
#[derive(Default)]
struct Moments {
    sum: f64,
    sq_sum: f64,
    count: f64,
}

impl Moments {
    /// Adds `values` where `mask` is set (a 0/1 tensor of the same shape).
    fn add(&mut self, values: &Tensor, mask: &Tensor) {
        tch::no_grad(|| {
            let masked = values * mask;
            self.sum += masked.sum(Kind::Double).double_value(&[]);
            self.sq_sum += (&masked * &masked).sum(Kind::Double).double_value(&[]);
            self.count += mask.sum(Kind::Double).double_value(&[]);
        });
    }

    /// Mean and standard deviation; `None` over no token.
    fn mean_std(&self) -> Option<(f64, f64)> {
        (self.count > 0.0).then(|| {
            let mean = self.sum / self.count;
            (
                mean,
                (self.sq_sum / self.count - mean * mean).max(0.0).sqrt(),
            )
        })
    }
}

/// Metrics summed over a step's micro-batches, each weighted by its share of the tokens.
#[derive(Default)]
struct Accumulated {
    loss: f64,
    clip_fraction: f64,
    ratio_mean: f64,
    kl: f64,
    entropy: f64,
    /// The combined advantage over the tokens under the loss.
    advantage: Moments,
    /// The hint-distillation advantage over the tokens it applied to.
    opd: Moments,
    /// Train/inference agreement over recorded tokens served by the weights trained now.
    agree_tokens: f64,
    agree_abs_sum: f64,
    agree_abs_max: f64,
    ratio_sum: f64,
    ratio_sq_sum: f64,
    ratio_min: f64,
    ratio_max: f64,
    outside_support: f64,
}

impl Accumulated {
    /// Adds one micro-batch's `current` log-probs (before this step's update) against the
    /// engine's recorded ones, on generated tokens whose behaviour was recorded by the weights
    /// being trained: what the trainer and the engine disagree on for the same policy.
    fn observe_agreement(&mut self, mb: &MicroBatch, current: &Tensor, in_support: &Tensor) {
        tch::no_grad(|| {
            let outside: Tensor = &mb.loss_mask * (1.0 - in_support);
            self.outside_support += outside.sum(Kind::Double).double_value(&[]);
            let recorded: Tensor = 1.0 - &mb.from_policy;
            let counted: Tensor = &mb.loss_mask * recorded * &mb.served_by_current * in_support;
            let n = counted.sum(Kind::Double).double_value(&[]);
            if n == 0.0 {
                return;
            }
            let diff = (current - &mb.behaviour) * &counted;
            let abs = diff.abs();
            let ratio = diff.exp();
            let on = counted.gt(0.0);
            let first = self.agree_tokens == 0.0;
            self.agree_tokens += n;
            self.agree_abs_sum += abs.sum(Kind::Double).double_value(&[]);
            self.agree_abs_max = self.agree_abs_max.max(abs.max().double_value(&[]));
            self.ratio_sum += (&ratio * &counted).sum(Kind::Double).double_value(&[]);
            self.ratio_sq_sum += (&ratio * &ratio * &counted)
                .sum(Kind::Double)
                .double_value(&[]);
            let masked = |fill: f64| ratio.masked_fill(&on.logical_not(), fill);
            let (lo, hi) = (
                masked(f64::INFINITY).min().double_value(&[]),
                masked(f64::NEG_INFINITY).max().double_value(&[]),
            );
            self.ratio_min = if first { lo } else { self.ratio_min.min(lo) };
            self.ratio_max = if first { hi } else { self.ratio_max.max(hi) };
        });
    }

    fn agreement(&self) -> Option<Agreement> {
        (self.agree_tokens > 0.0).then(|| {
            let n = self.agree_tokens;
            let mean = self.ratio_sum / n;
            Agreement {
                tokens: n as u64,
                mean_abs_logprob_diff: self.agree_abs_sum / n,
                max_abs_logprob_diff: self.agree_abs_max,
                ratio_std: (self.ratio_sq_sum / n - mean * mean).max(0.0).sqrt(),
                ratio_min: self.ratio_min,
                ratio_max: self.ratio_max,
            }
        })
    }
}

/// The options scoring needs, borrowed from the config and the loaded parts.
pub fn score_options<'a>(
    config: &TrainConfig,
    engine_defaults: EngineDefaults,
    vocab_size: i64,
    weights: &'a clawback_datapool::reward::RewardWeights,
    text: Option<&'a TextCodec>,
    current_version: Option<u64>,
) -> ScoreOptions<'a> {
    ScoreOptions {
        samples: SampleOptions {
            current_version,
            max_staleness: config.batch.max_staleness,
            max_merged_len: Some(config.batch.max_seq_len),
            engine_defaults,
            logprobs_mode: config.sampler.logprobs,
        },
        weights,
        normalization: config.group_normalization(),
        reinforce: config.loss.rl_weight > 0.0,
        distill: config.loss.opd_weight > 0.0,
        max_seq_len: config.batch.max_seq_len,
        vocab_size: usize::try_from(vocab_size).unwrap_or(0),
        text,
    }
}
