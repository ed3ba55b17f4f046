//! From recorded trajectories to training samples (issue 5, "Batches"): each trainable step's
//! prompt and completion ids become a sequence whose loss mask is 1 only on the tokens the model
//! generated, consecutive steps whose token ids extend each other share one sequence, stale and
//! redelivered steps are dropped and counted, and text-only steps are handed back for
//! re-tokenisation. Pure bookkeeping: no tensors, no I/O.
//!
//! Every per-position vector of a [`Sample`] is aligned with `input_ids` the way `losses` expects:
//! entry `t` is about token `t` (its behaviour log-prob is log π(input_ids[t] | input_ids[..t])).
//!
//! **Merge rule.** Steps are taken in the order the store lists them. A step joins the sample
//! built so far when its `prompt_token_ids` start with that sample's whole `input_ids` (every
//! earlier prompt, completion and in-between token, id for id), the same policy served it, and
//! the result stays within [`SampleOptions::max_merged_len`]; the rest of its prompt (tool
//! results, the user's reply, the chat template's turn markers) goes in with mask 0 and its
//! completion with mask 1. Nothing is guessed: when the template renders an earlier turn
//! differently (reasoning stripped, a different end-of-turn token), the step starts a new sample.
//! An end-of-turn token the engine did not return but the next prompt carries is a prompt token
//! there: mask 0, as it was never sampled. A step dropped in between (side turn, duplicate,
//! stale) leaves its tokens in the next prompt, so they join as context with mask 0.
//!
//! **The sampler.** Each span carries the [`Sampler`] that was in force for its call (the
//! request's parameters, else the engine's defaults): the trainer scores it under that
//! distribution. Its recorded log-probs are its behaviour only when they describe that
//! distribution (see [`crate::sampler`]); otherwise the span is scored by the current policy and
//! counted in [`SampleStats::logprobs_not_sampler`].

use std::collections::{HashSet, VecDeque};
use std::ops::Range;

use clawback_datapool::{
    EngineTokens, PolicyRef, Step, StepId, Tokens, TrajectoryId, TrajectoryRecord,
};
use serde::{Deserialize, Serialize};

use crate::sampler::{EngineDefaults, LogprobsMode, Sampler};

/// What decides whether a step is still on-policy enough to learn from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleOptions {
    /// The version of the policy being trained (the tenant's live adapter); `None` turns the
    /// staleness check off.
    pub current_version: Option<u64>,
    /// K: a step served by a version more than K behind `current_version` is dropped. A step
    /// with no policy was served by the base model and counts as version 0.
    pub max_staleness: u64,
    /// The longest sequence a merge may produce (the model's context, or the packing length);
    /// a step that would overflow it starts a new sample instead. `None`: no limit. A single
    /// step longer than this is left as it is, for the batcher to truncate or skip.
    pub max_merged_len: Option<usize>,
    /// The engine's values for what a request left unset.
    pub engine_defaults: EngineDefaults,
    /// What the engine's recorded log-probs are.
    pub logprobs_mode: LogprobsMode,
}

/// What [`samples_from`] did with the steps it was given; added up across calls for the
/// per-step metrics ("samples dropped").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleStats {
    /// Every step looked at, whatever became of it.
    pub steps_in: u64,
    /// Engine-token samples built (text-only steps are not counted here).
    pub samples_out: u64,
    /// Steps that joined an earlier step's sequence instead of starting their own.
    pub merged_steps: u64,
    /// Steps served by a policy more than K versions old.
    pub stale_dropped: u64,
    /// Steps already handed out once (a redelivery).
    pub duplicate_dropped: u64,
    /// Steps without engine token ids, handed back for re-tokenisation.
    pub text_only: u64,
    /// Side turns: recorded, never trained on.
    pub not_trainable: u64,
    /// Engine steps whose logprobs were absent or did not match the completion ids one for one;
    /// their behaviour log-probs must come from the current policy.
    pub logprobs_missing: u64,
    /// Engine steps with an empty completion: nothing was generated, so nothing to learn.
    pub empty_completion: u64,
    /// Engine steps whose recorded log-probs are raw while the sampler was not neutral: they
    /// do not describe the distribution the tokens were drawn from, so the current policy
    /// scores the span instead (run the engine with `processed_logprobs` to keep them).
    #[serde(default)]
    pub logprobs_not_sampler: u64,
    /// Steps sampled greedily (temperature 0), scored at temperature 1 (see `sampler`).
    #[serde(default)]
    pub greedy: u64,
    /// Engine steps whose request used a logits processor the trainer does not reproduce
    /// (`logit_bias`, `min_tokens`, structured outputs, a forced tool call: see `sampler`):
    /// their behaviour comes from the current policy.
    #[serde(default)]
    pub sampler_unmodelled: u64,
}

/// Where the behaviour log-probs of a generated span come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behaviour {
    /// As the engine sampled them, stored in [`Sample::behaviour_logprobs`].
    Recorded,
    /// Not recorded (or unusable): the trainer scores the span with the current policy and
    /// passes those detached log-probs as behaviour, which makes the ratio 1 there.
    CurrentPolicy,
}

/// Whose token ids a sample holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokensSource {
    /// The engine's own ids, never re-tokenised.
    Engine,
    /// Ids the trainer's tokenizer produced from the recorded text.
    Retokenised,
}

/// The completion of one step inside a sample: where its reward, hint or teacher log-probs go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GeneratedSpan {
    pub step: StepId,
    /// The step's 0-based position in its trajectory.
    pub step_index: u32,
    /// Positions in [`Sample::input_ids`] of the step's completion tokens.
    pub positions: Range<usize>,
    pub behaviour: Behaviour,
    /// The distribution its tokens were drawn from.
    pub sampler: Sampler,
}

/// One training sequence: one step, or several consecutive steps whose ids extend each other.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub trajectory: TrajectoryId,
    /// The steps whose completions the sample trains, in order.
    pub step_ids: Vec<StepId>,
    pub input_ids: Vec<u32>,
    /// 1 on tokens the model generated, 0 on prompt, tool output and template tokens.
    pub loss_mask: Vec<u8>,
    /// The recorded log-prob of each generated token; 0 where the mask is 0 and on spans whose
    /// behaviour is [`Behaviour::CurrentPolicy`].
    pub behaviour_logprobs: Vec<f32>,
    /// One per entry of `step_ids`.
    pub spans: Vec<GeneratedSpan>,
    /// The policy that served every step of the sample (`None`: the base model).
    pub policy: Option<PolicyRef>,
    pub tokens_source: TokensSource,
}

impl Sample {
    /// The sequence length.
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Tokens under the loss mask.
    pub fn generated_tokens(&self) -> usize {
        self.spans.iter().map(|s| s.positions.len()).sum()
    }

    /// Whether every span carries the engine's behaviour log-probs; when not, the trainer
    /// fills the [`Behaviour::CurrentPolicy`] spans from the current policy.
    pub fn behaviour_recorded(&self) -> bool {
        self.spans
            .iter()
            .all(|s| s.behaviour == Behaviour::Recorded)
    }

    /// A per-position vector holding `value(span)` on each span's generated tokens and 0
    /// elsewhere: how a per-step reward or advantage is broadcast over a merged sequence.
    pub fn per_token(&self, mut value: impl FnMut(&GeneratedSpan) -> f32) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        for span in &self.spans {
            let v = value(span);
            for x in &mut out[span.positions.clone()] {
                *x = v;
            }
        }
        out
    }

    fn start(
        trajectory: TrajectoryId,
        step: &Step,
        engine: &EngineTokens,
        behaviour: Behaviour,
        sampler: Sampler,
    ) -> Self {
        let mut sample = Sample {
            trajectory,
            step_ids: Vec::new(),
            input_ids: Vec::new(),
            loss_mask: Vec::new(),
            behaviour_logprobs: Vec::new(),
            spans: Vec::new(),
            policy: step.policy.clone(),
            tokens_source: TokensSource::Engine,
        };
        sample.push_context(&engine.prompt_token_ids);
        sample.push_completion(step.id, step.index, engine, behaviour, sampler);
        sample
    }

    /// Whether `step` continues this sequence under the merge rule (module docs).
    fn is_extended_by(&self, step: &Step, engine: &EngineTokens, options: &SampleOptions) -> bool {
        let merged_len = engine.prompt_token_ids.len() + engine.completion_token_ids.len();
        self.policy == step.policy
            && options.max_merged_len.is_none_or(|max| merged_len <= max)
            && engine.prompt_token_ids.starts_with(&self.input_ids)
    }

    /// Appends the part of `engine`'s prompt this sequence does not have yet, then its completion.
    fn extend_with(
        &mut self,
        step: &Step,
        engine: &EngineTokens,
        behaviour: Behaviour,
        sampler: Sampler,
    ) {
        let already = self.input_ids.len();
        self.push_context(&engine.prompt_token_ids[already..]);
        self.push_completion(step.id, step.index, engine, behaviour, sampler);
    }

    fn push_context(&mut self, ids: &[u32]) {
        self.input_ids.extend_from_slice(ids);
        self.loss_mask.resize(self.input_ids.len(), 0);
        self.behaviour_logprobs.resize(self.input_ids.len(), 0.0);
    }

    fn push_completion(
        &mut self,
        step: StepId,
        step_index: u32,
        engine: &EngineTokens,
        behaviour: Behaviour,
        sampler: Sampler,
    ) {
        let start = self.input_ids.len();
        self.input_ids
            .extend_from_slice(&engine.completion_token_ids);
        self.loss_mask.resize(self.input_ids.len(), 1);
        match behaviour {
            Behaviour::Recorded => self.behaviour_logprobs.extend(
                engine
                    .completion_logprobs
                    .logprobs()
                    .iter()
                    .map(|&logprob| logprob as f32),
            ),
            Behaviour::CurrentPolicy => self.behaviour_logprobs.resize(self.input_ids.len(), 0.0),
        }
        self.step_ids.push(step);
        self.spans.push(GeneratedSpan {
            step,
            step_index,
            positions: start..self.input_ids.len(),
            behaviour,
            sampler,
        });
    }
}

/// A trainable step recorded without engine ids (an OpenAI upstream): the trainer renders its
/// messages with the chat template, tokenises them, and builds the sample with
/// [`TextOnlyStep::into_sample`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextOnlyStep {
    pub trajectory: TrajectoryId,
    pub step: StepId,
    pub step_index: u32,
    pub policy: Option<PolicyRef>,
    pub sampler: Sampler,
}

impl TextOnlyStep {
    /// The step's sample from the trainer's own ids: mask 1 on the completion, behaviour from
    /// the current policy (there are no recorded log-probs of these ids to reuse).
    pub fn into_sample(self, prompt_ids: &[u32], completion_ids: &[u32]) -> Sample {
        let mut input_ids = Vec::with_capacity(prompt_ids.len() + completion_ids.len());
        input_ids.extend_from_slice(prompt_ids);
        input_ids.extend_from_slice(completion_ids);
        let mut loss_mask = vec![0; prompt_ids.len()];
        loss_mask.resize(input_ids.len(), 1);
        Sample {
            trajectory: self.trajectory,
            step_ids: vec![self.step],
            behaviour_logprobs: vec![0.0; input_ids.len()],
            spans: vec![GeneratedSpan {
                step: self.step,
                step_index: self.step_index,
                positions: prompt_ids.len()..input_ids.len(),
                behaviour: Behaviour::CurrentPolicy,
                sampler: self.sampler,
            }],
            input_ids,
            loss_mask,
            policy: self.policy,
            tokens_source: TokensSource::Retokenised,
        }
    }
}

/// What one trajectory yields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrajectorySamples {
    /// Built from the engine's ids.
    pub samples: Vec<Sample>,
    /// To be re-tokenised by the trainer.
    pub retokenise: Vec<TextOnlyStep>,
}

/// The ids of the steps already handed out, so that a batch the consumer group delivers again
/// (after a crash before the ack) is never applied twice.
///
/// Bounded: the oldest ids are forgotten first, so `capacity` must exceed the number of steps
/// that can be delivered and not yet acked. The trainer persists it with each checkpoint (it is
/// serde) and restores it on resume: a step handed out after the checkpoint is then not in the
/// restored set and is applied again, exactly once, when its unacked batch comes back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "SeenStepsState", into = "SeenStepsState")]
pub struct SeenSteps {
    capacity: usize,
    order: VecDeque<StepId>,
    set: HashSet<StepId>,
}

/// The persisted form of [`SeenSteps`]: the ids oldest first; the set is rebuilt on load.
#[derive(Serialize, Deserialize)]
struct SeenStepsState {
    capacity: usize,
    steps: Vec<StepId>,
}

impl SeenSteps {
    /// An empty set remembering at most `capacity` ids (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SeenSteps {
            capacity,
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            set: HashSet::new(),
        }
    }

    pub fn contains(&self, step: &StepId) -> bool {
        self.set.contains(step)
    }

    /// Remembers `step`, forgetting the oldest id when full; false when it was already there.
    pub fn insert(&mut self, step: StepId) -> bool {
        if !self.set.insert(step) {
            return false;
        }
        self.order.push_back(step);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl From<SeenStepsState> for SeenSteps {
    fn from(state: SeenStepsState) -> Self {
        let mut seen = SeenSteps::new(state.capacity);
        for step in state.steps {
            seen.insert(step);
        }
        seen
    }
}

impl From<SeenSteps> for SeenStepsState {
    fn from(seen: SeenSteps) -> Self {
        SeenStepsState {
            capacity: seen.capacity,
            steps: seen.order.into(),
        }
    }
}

/// The samples of one trajectory, under the merge rule of the module docs. Side turns, steps
/// already in `seen`, stale steps and empty completions are dropped and counted in `stats`; the
/// steps handed out (engine samples and text-only steps alike) are added to `seen`.
/// Staleness applies to text-only steps too: their ratio is 1 only because no behaviour
/// log-probs exist, not because they are on-policy.
pub fn samples_from(
    record: &TrajectoryRecord,
    options: &SampleOptions,
    seen: &mut SeenSteps,
    stats: &mut SampleStats,
) -> TrajectorySamples {
    let trajectory = record.trajectory.id;
    let mut out = TrajectorySamples::default();
    let mut open: Option<Sample> = None;
    for step in &record.steps {
        stats.steps_in += 1;
        if !step.trainable {
            stats.not_trainable += 1;
            continue;
        }
        if seen.contains(&step.id) {
            stats.duplicate_dropped += 1;
            continue;
        }
        if is_stale(step, options) {
            stats.stale_dropped += 1;
            continue;
        }
        let sampler = Sampler::resolve(&step.request.sampling, &options.engine_defaults);
        let engine = match &step.tokens {
            Tokens::Engine(engine) => engine,
            Tokens::None => {
                stats.text_only += 1;
                seen.insert(step.id);
                out.retokenise.push(TextOnlyStep {
                    trajectory,
                    step: step.id,
                    step_index: step.index,
                    policy: step.policy.clone(),
                    sampler,
                });
                continue;
            }
        };
        if engine.completion_token_ids.is_empty() {
            stats.empty_completion += 1;
            continue;
        }
        seen.insert(step.id);
        if sampler.is_greedy() {
            stats.greedy += 1;
        }
        // A logprob list that does not pair up with the ids one for one cannot be trusted for
        // any token: positions would silently shift.
        let behaviour = if engine.completion_logprobs.len() != engine.completion_token_ids.len() {
            stats.logprobs_missing += 1;
            Behaviour::CurrentPolicy
        } else if !sampler.logprobs_describe_it(options.logprobs_mode) {
            stats.logprobs_not_sampler += 1;
            Behaviour::CurrentPolicy
        } else if crate::sampler::unmodelled(&step.request).is_some() {
            stats.sampler_unmodelled += 1;
            Behaviour::CurrentPolicy
        } else {
            Behaviour::Recorded
        };
        match open.as_mut() {
            Some(sample) if sample.is_extended_by(step, engine, options) => {
                sample.extend_with(step, engine, behaviour, sampler);
                stats.merged_steps += 1;
            }
            _ => {
                let next = Sample::start(trajectory, step, engine, behaviour, sampler);
                out.samples.extend(open.replace(next));
            }
        }
    }
    out.samples.extend(open);
    stats.samples_out += out.samples.len() as u64;
    out
}

fn is_stale(step: &Step, options: &SampleOptions) -> bool {
    let Some(current) = options.current_version else {
        return false;
    };
    let served = step.policy.as_ref().map_or(0, |p| p.version);
    current.saturating_sub(served) > options.max_staleness
}

#[cfg(test)]
mod tests {
    use clawback_datapool::example::tool_use_trajectory;
    use clawback_datapool::TenantId;

    use super::*;

    const RECORDED: &str = include_str!("../../datapool/examples/recorded-trajectory.json");

    fn example() -> TrajectoryRecord {
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        tool_use_trajectory(tenant)
    }

    fn recorded() -> TrajectoryRecord {
        serde_json::from_str(RECORDED).unwrap_or_else(|e| panic!("recorded trajectory: {e}"))
    }

    fn engine(step: &Step) -> &EngineTokens {
        match &step.tokens {
            Tokens::Engine(e) => e,
            Tokens::None => panic!("step {} has no engine tokens", step.index),
        }
    }

    fn engine_mut(step: &mut Step) -> &mut EngineTokens {
        match &mut step.tokens {
            Tokens::Engine(e) => e,
            Tokens::None => panic!("step {} has no engine tokens", step.index),
        }
    }

    fn run(record: &TrajectoryRecord, options: SampleOptions) -> (TrajectorySamples, SampleStats) {
        let mut seen = SeenSteps::new(1024);
        let mut stats = SampleStats::default();
        let out = samples_from(record, &options, &mut seen, &mut stats);
        (out, stats)
    }

    /// The engine ran `processed_logprobs`: recorded log-probs describe any sampler.
    fn processed() -> SampleOptions {
        SampleOptions {
            logprobs_mode: LogprobsMode::Processed,
            ..SampleOptions::default()
        }
    }

    fn ranges_of_ones(mask: &[u8]) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut start = None;
        for (i, &m) in mask.iter().chain(std::iter::once(&0)).enumerate() {
            match (m, start) {
                (1, None) => start = Some(i),
                (0, Some(s)) => {
                    out.push(s..i);
                    start = None;
                }
                _ => {}
            }
        }
        out
    }

    #[test]
    fn two_steps_whose_prompts_extend_each_other_become_one_sequence_masked_on_completions_only() {
        let record = example();
        let (first, second) = (engine(&record.steps[0]), engine(&record.steps[1]));
        let (out, stats) = run(&record, processed());

        assert_eq!(out.samples.len(), 1);
        let s = &out.samples[0];
        assert_eq!(
            s.input_ids,
            [
                &second.prompt_token_ids[..],
                &second.completion_token_ids[..]
            ]
            .concat()
        );
        assert_eq!(s.step_ids, vec![record.steps[0].id, record.steps[1].id]);

        let p0 = first.prompt_token_ids.len();
        let c0 = p0 + first.completion_token_ids.len();
        let p1 = second.prompt_token_ids.len();
        let c1 = p1 + second.completion_token_ids.len();
        assert_eq!(ranges_of_ones(&s.loss_mask), vec![p0..c0, p1..c1]);
        assert_eq!(s.spans[0].positions, p0..c0);
        assert_eq!(s.spans[1].positions, p1..c1);
        assert_eq!(s.spans[1].step_index, 1);

        // Behaviour log-probs sit on the generated tokens they belong to, 0 elsewhere.
        assert_eq!(s.behaviour_logprobs.len(), s.len());
        assert_eq!(s.behaviour_logprobs[p0], -0.0123);
        assert_eq!(s.behaviour_logprobs[c0 - 1], -0.0001);
        assert_eq!(s.behaviour_logprobs[p1], -0.2107);
        assert_eq!(s.behaviour_logprobs[c1 - 1], -0.0002);
        assert!(s.behaviour_logprobs[c0..p1].iter().all(|&x| x == 0.0));
        assert!(s.behaviour_logprobs[..p0].iter().all(|&x| x == 0.0));
        assert!(s.behaviour_recorded());
        assert_eq!(s.tokens_source, TokensSource::Engine);
        assert_eq!(s.policy, record.steps[0].policy);

        assert_eq!(
            stats,
            SampleStats {
                steps_in: 2,
                samples_out: 1,
                merged_steps: 1,
                ..SampleStats::default()
            }
        );
    }

    #[test]
    fn a_step_whose_prompt_disagrees_on_one_id_starts_a_new_sample() {
        let mut record = example();
        // The template rendered the earlier assistant turn differently (say, reasoning stripped).
        engine_mut(&mut record.steps[1]).prompt_token_ids[30] += 1;
        let (out, stats) = run(&record, SampleOptions::default());

        assert_eq!(out.samples.len(), 2);
        for (sample, step) in out.samples.iter().zip(&record.steps) {
            let e = engine(step);
            let p = e.prompt_token_ids.len();
            assert_eq!(sample.step_ids, vec![step.id]);
            assert_eq!(
                sample.input_ids,
                [&e.prompt_token_ids[..], &e.completion_token_ids[..]].concat()
            );
            assert_eq!(ranges_of_ones(&sample.loss_mask), vec![p..sample.len()]);
        }
        assert_eq!(stats.merged_steps, 0);
        assert_eq!(stats.samples_out, 2);
    }

    #[test]
    fn an_end_of_turn_token_the_engine_did_not_return_is_context_in_the_merged_sequence() {
        let mut record = example();
        // The engine stopped on <|im_end|> without returning it; the next prompt still has it.
        let first = engine_mut(&mut record.steps[0]);
        first.completion_token_ids.pop();
        let kept = first.completion_token_ids.len();
        first.completion_logprobs.truncate(kept);
        let eos_at = first.prompt_token_ids.len() + first.completion_token_ids.len();
        let (out, stats) = run(&record, SampleOptions::default());

        assert_eq!(out.samples.len(), 1);
        let s = &out.samples[0];
        assert_eq!(s.input_ids[eos_at], 151645);
        assert_eq!(s.loss_mask[eos_at], 0);
        assert_eq!(s.spans[0].positions.end, eos_at);
        assert_eq!(stats.merged_steps, 1);
    }

    #[test]
    fn the_real_recording_re_renders_the_first_turn_so_its_steps_stay_apart() {
        let record = recorded();
        let (out, stats) = run(&record, SampleOptions::default());

        assert_eq!(out.samples.len(), 2);
        for (sample, step) in out.samples.iter().zip(&record.steps) {
            let e = engine(step);
            assert_eq!(sample.policy, None);
            assert_eq!(
                sample.spans[0].positions,
                e.prompt_token_ids.len()..sample.len()
            );
            assert_eq!(sample.generated_tokens(), e.completion_token_ids.len());
            assert!(sample.behaviour_recorded());
            let recorded: Vec<f32> = e
                .completion_logprobs
                .iter()
                .map(|l| l.logprob as f32)
                .collect();
            assert_eq!(
                sample.behaviour_logprobs[e.prompt_token_ids.len()..],
                recorded[..]
            );
        }
        assert_eq!(stats.steps_in, 2);
        assert_eq!(stats.logprobs_missing, 0);
    }

    #[test]
    fn a_side_turn_is_skipped_and_does_not_break_the_merge_around_it() {
        let mut record = example();
        let mut side = record.steps[0].clone();
        side.id = StepId::new();
        side.trainable = false;
        engine_mut(&mut side).prompt_token_ids = vec![151644, 8948, 198, 9, 9, 9];
        record.steps.insert(1, side);
        let (out, stats) = run(&record, SampleOptions::default());

        assert_eq!(out.samples.len(), 1);
        assert_eq!(
            out.samples[0].step_ids,
            vec![record.steps[0].id, record.steps[2].id]
        );
        assert_eq!(stats.not_trainable, 1);
        assert_eq!(stats.merged_steps, 1);
    }

    #[test]
    fn steps_more_than_k_versions_old_are_dropped_and_counted() {
        let record = example(); // served by version 17
        let options = |k| SampleOptions {
            current_version: Some(20),
            max_staleness: k,
            ..SampleOptions::default()
        };

        let (out, stats) = run(&record, options(2));
        assert!(out.samples.is_empty());
        assert_eq!(stats.stale_dropped, 2);
        assert_eq!(stats.samples_out, 0);

        let (out, stats) = run(&record, options(3));
        assert_eq!(out.samples.len(), 1);
        assert_eq!(stats.stale_dropped, 0);
    }

    #[test]
    fn a_step_served_by_the_base_model_counts_as_version_zero() {
        let record = recorded(); // no policy on its steps
        let options = |current| SampleOptions {
            current_version: Some(current),
            max_staleness: 4,
            ..SampleOptions::default()
        };
        assert_eq!(run(&record, options(4)).0.samples.len(), 2);
        let (out, stats) = run(&record, options(5));
        assert!(out.samples.is_empty());
        assert_eq!(stats.stale_dropped, 2);
    }

    #[test]
    fn a_redelivered_trajectory_is_never_applied_twice() {
        let record = example();
        let mut seen = SeenSteps::new(1024);
        let mut stats = SampleStats::default();
        let options = SampleOptions::default();

        let first = samples_from(&record, &options, &mut seen, &mut stats);
        assert_eq!(first.samples.len(), 1);
        let again = samples_from(&record, &options, &mut seen, &mut stats);
        assert!(again.samples.is_empty());
        assert_eq!(stats.duplicate_dropped, 2);
        assert_eq!(stats.samples_out, 1);
        assert_eq!(stats.steps_in, 4);
    }

    #[test]
    fn a_redelivery_with_one_new_step_trains_only_the_new_completion() {
        let full = example();
        let mut first_half = full.clone();
        first_half.steps.truncate(1);
        let mut seen = SeenSteps::new(1024);
        let mut stats = SampleStats::default();
        let options = SampleOptions::default();

        samples_from(&first_half, &options, &mut seen, &mut stats);
        let out = samples_from(&full, &options, &mut seen, &mut stats);

        assert_eq!(out.samples.len(), 1);
        let s = &out.samples[0];
        let second = engine(&full.steps[1]);
        assert_eq!(s.step_ids, vec![full.steps[1].id]);
        assert_eq!(
            ranges_of_ones(&s.loss_mask),
            vec![second.prompt_token_ids.len()..s.len()]
        );
        assert_eq!(stats.duplicate_dropped, 1);
    }

    #[test]
    fn a_text_only_step_is_routed_for_re_tokenisation_and_behaves_as_the_current_policy() {
        let mut record = example();
        record.steps[1].tokens = Tokens::None;
        let mut seen = SeenSteps::new(1024);
        let mut stats = SampleStats::default();
        let out = samples_from(&record, &SampleOptions::default(), &mut seen, &mut stats);

        assert_eq!(out.samples.len(), 1);
        assert_eq!(out.samples[0].step_ids, vec![record.steps[0].id]);
        assert_eq!(out.retokenise.len(), 1);
        assert_eq!(out.retokenise[0].step, record.steps[1].id);
        assert_eq!(stats.text_only, 1);
        assert!(seen.contains(&record.steps[1].id));

        let s = out.retokenise[0].clone().into_sample(&[1, 2, 3], &[4, 5]);
        assert_eq!(s.input_ids, vec![1, 2, 3, 4, 5]);
        assert_eq!(s.loss_mask, vec![0, 0, 0, 1, 1]);
        assert_eq!(s.tokens_source, TokensSource::Retokenised);
        assert!(!s.behaviour_recorded());
    }

    #[test]
    fn logprobs_that_do_not_pair_up_with_the_ids_are_flagged_and_left_to_the_current_policy() {
        let mut record = example();
        let second = engine_mut(&mut record.steps[1]);
        second
            .completion_logprobs
            .truncate(second.completion_token_ids.len() - 1);
        let (out, stats) = run(&record, processed());

        assert_eq!(out.samples.len(), 1);
        let s = &out.samples[0];
        assert_eq!(s.spans[0].behaviour, Behaviour::Recorded);
        assert_eq!(s.spans[1].behaviour, Behaviour::CurrentPolicy);
        assert!(!s.behaviour_recorded());
        assert!(s.behaviour_logprobs[s.spans[1].positions.clone()]
            .iter()
            .all(|&x| x == 0.0));
        assert_eq!(s.behaviour_logprobs.len(), s.len());
        // The tokens are still generated: the mask does not depend on the logprobs.
        assert_eq!(ranges_of_ones(&s.loss_mask).len(), 2);
        assert_eq!(stats.logprobs_missing, 1);
    }

    #[test]
    fn raw_logprobs_stand_for_the_behaviour_only_when_the_sampler_is_neutral() {
        // The example was sampled at temperature 0.7: raw logprobs are not its distribution.
        let mut record = example();
        let (out, stats) = run(&record, SampleOptions::default());
        let s = &out.samples[0];
        assert!(s
            .spans
            .iter()
            .all(|x| x.behaviour == Behaviour::CurrentPolicy));
        assert_eq!(s.spans[0].sampler.temperature, 0.7);
        assert_eq!(stats.logprobs_not_sampler, 2);
        // The same call at temperature 1, no truncation, no penalty: raw is processed.
        for step in &mut record.steps {
            step.request.sampling.temperature = Some(1.0);
            step.request.sampling.top_p = None;
        }
        let (out, stats) = run(&record, SampleOptions::default());
        assert!(out.samples[0].behaviour_recorded());
        assert_eq!(stats.logprobs_not_sampler, 0);
        // Unset knobs come from the engine's defaults (generation_config.json).
        for step in &mut record.steps {
            step.request.sampling.temperature = None;
        }
        let defaults = EngineDefaults {
            top_k: Some(20),
            ..EngineDefaults::NONE
        };
        let options = SampleOptions {
            engine_defaults: defaults,
            ..SampleOptions::default()
        };
        let (out, stats) = run(&record, options);
        assert_eq!(out.samples[0].spans[1].sampler.top_k, Some(20));
        assert_eq!(stats.logprobs_not_sampler, 2);
        let (out, stats) = run(
            &record,
            SampleOptions {
                logprobs_mode: LogprobsMode::Processed,
                ..options
            },
        );
        assert!(out.samples[0].behaviour_recorded());
        assert_eq!(stats.logprobs_not_sampler, 0);
    }

    #[test]
    fn steps_served_by_different_policy_versions_do_not_share_a_sample() {
        let mut record = example();
        record.steps[1].policy = Some(PolicyRef {
            adapter: "acme@v18".into(),
            version: 18,
        });
        let (out, _) = run(&record, SampleOptions::default());
        assert_eq!(out.samples.len(), 2);
        assert_eq!(out.samples[1].policy.as_ref().map(|p| p.version), Some(18));
    }

    #[test]
    fn a_merge_that_would_overflow_the_length_limit_starts_a_new_sample() {
        let record = example();
        let second = engine(&record.steps[1]);
        let whole = second.prompt_token_ids.len() + second.completion_token_ids.len();
        let limit = |max| SampleOptions {
            max_merged_len: Some(max),
            ..SampleOptions::default()
        };
        assert_eq!(run(&record, limit(whole)).0.samples.len(), 1);
        let (out, stats) = run(&record, limit(whole - 1));
        assert_eq!(out.samples.len(), 2);
        assert_eq!(stats.merged_steps, 0);
    }

    #[test]
    fn an_empty_completion_is_dropped_and_counted() {
        let mut record = example();
        let e = engine_mut(&mut record.steps[0]);
        e.completion_token_ids.clear();
        e.completion_logprobs.truncate(0);
        let (out, stats) = run(&record, SampleOptions::default());
        assert_eq!(out.samples.len(), 1);
        assert_eq!(out.samples[0].step_ids, vec![record.steps[1].id]);
        assert_eq!(stats.empty_completion, 1);
    }

    #[test]
    fn per_step_values_are_broadcast_over_their_own_generated_tokens() {
        let record = example();
        let (out, _) = run(&record, SampleOptions::default());
        let s = &out.samples[0];
        let rewards = s.per_token(|span| if span.step_index == 0 { 1.0 } else { -1.0 });
        for (t, &r) in rewards.iter().enumerate() {
            let expected = s
                .spans
                .iter()
                .find(|span| span.positions.contains(&t))
                .map_or(0.0, |span| if span.step_index == 0 { 1.0 } else { -1.0 });
            assert_eq!(r, expected, "position {t}");
        }
        assert_eq!(
            rewards.iter().filter(|&&r| r != 0.0).count(),
            s.generated_tokens()
        );
    }

    #[test]
    fn seen_steps_forget_the_oldest_first_and_survive_a_checkpoint_round_trip() {
        let ids: Vec<StepId> = (0..3).map(|_| StepId::new()).collect();
        let mut seen = SeenSteps::new(2);
        for &id in &ids {
            assert!(seen.insert(id));
        }
        assert!(!seen.insert(ids[2]));
        assert!(!seen.contains(&ids[0]));
        assert!(seen.contains(&ids[1]) && seen.contains(&ids[2]));

        let json = serde_json::to_string(&seen).unwrap_or_else(|e| panic!("{e}"));
        let back: SeenSteps = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, seen);
        assert_eq!(back.capacity(), 2);
    }
}
