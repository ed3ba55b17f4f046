//! One optimizer step's samples cut into micro-batches under a token budget, and each
//! micro-batch laid out as the tensors the loss takes.
//!
//! Samples are bucketed by length (longest first, so each micro-batch holds sequences of
//! similar length and pads little); a micro-batch takes samples while rows × its longest
//! sequence stay within the budget. Rows are right-padded: padded positions come after every
//! real token, so the causal mask is enough and the loss mask hides them.
//!
//! Layout: position `t` of a sample is about token `t`; the model sees tokens `0..n-1` and
//! column `j` of every `[rows, n-1]` tensor scores token `j + 1`.

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use crate::sampler::Sampler;
use crate::samples::Behaviour;
use crate::train::advantages::Scored;

/// Indices of `lengths` grouped into micro-batches: longest first, each group's
/// `rows × longest ≤ token_budget` (a single sequence over the budget still gets its own).
pub fn plan(lengths: &[usize], token_budget: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
    let mut out: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match out.last_mut() {
            Some(group) if (group.len() + 1) * lengths[group[0]] <= token_budget => group.push(i),
            _ => out.push(vec![i]),
        }
    }
    out
}

/// Columns of one row whose logits go through a non-neutral sampler before scoring.
#[derive(Debug, Clone)]
pub struct SampledSpan {
    pub row: usize,
    pub cols: Range<usize>,
    pub sampler: Sampler,
    /// Every token before the span's first scored token (the engine's prompt of the call).
    pub context: Vec<i64>,
    /// The tokens the columns score, in order.
    pub completion: Vec<i64>,
}

/// The tensors of one micro-batch, `[rows, width]` each, on the training device.
#[derive(Debug)]
pub struct MicroBatch {
    pub inputs: Tensor,
    pub targets: Tensor,
    /// Recorded behaviour log-probs (0 where they must come from the current policy).
    pub behaviour: Tensor,
    /// 1 where the behaviour log-prob is the current policy's (not recorded).
    pub from_policy: Tensor,
    /// Whether any position needs `from_policy` (saves a pass when none does).
    pub needs_policy_behaviour: bool,
    pub rl_advantages: Tensor,
    pub rl_mask: Tensor,
    /// The teacher's log-probs on distilled spans (0 elsewhere) and where they apply.
    pub teacher: Tensor,
    pub opd_mask: Tensor,
    /// 1 on generated tokens.
    pub loss_mask: Tensor,
    /// `[rows, 1]`: 1 on rows served by the weights being trained now (what the
    /// train/inference agreement is measured on).
    pub served_by_current: Tensor,
    /// The spans whose sampler is not the model's own softmax, by row then column.
    pub sampled: Vec<SampledSpan>,
    /// Tokens the loss counts: generated and under the RL or the distillation mask.
    pub counted_tokens: usize,
    /// Every position, padding excluded: what tokens/s counts.
    pub real_tokens: usize,
}

impl MicroBatch {
    /// Lays out `items`; `teacher(prompt, completion, sampler)` scores a distilled span's
    /// completion after its hint-augmented prompt. `current_version` is the version the
    /// weights being trained were (or will be) published as (0: none yet, the base).
    pub fn build<E>(
        items: &[&Scored],
        device: Device,
        current_version: u64,
        mut teacher: impl FnMut(&[u32], &[u32], &Sampler) -> Result<Vec<f32>, E>,
    ) -> Result<Self, E> {
        let rows = items.len();
        let width = items
            .iter()
            .map(|s| s.sample.len().saturating_sub(1))
            .max()
            .unwrap_or(0)
            .max(1);
        let cells = rows * width;
        let mut inputs = vec![0i64; cells];
        let mut targets = vec![0i64; cells];
        let mut behaviour = vec![0f32; cells];
        let mut from_policy = vec![0f32; cells];
        let mut rl_adv = vec![0f32; cells];
        let mut rl_mask = vec![0f32; cells];
        let mut teacher_lp = vec![0f32; cells];
        let mut opd_mask = vec![0f32; cells];
        let mut loss_mask = vec![0f32; cells];
        let mut served_by_current = vec![0f32; rows];
        let mut sampled = Vec::new();
        let mut real_tokens = 0;
        for (r, item) in items.iter().enumerate() {
            let s = &item.sample;
            let row = r * width;
            real_tokens += s.len();
            let served = s.policy.as_ref().map_or(0, |p| p.version);
            served_by_current[r] = f32::from(u8::from(served == current_version));
            for (j, pair) in s.input_ids.windows(2).enumerate() {
                inputs[row + j] = i64::from(pair[0]);
                targets[row + j] = i64::from(pair[1]);
                loss_mask[row + j] = f32::from(s.loss_mask[j + 1]);
                behaviour[row + j] = s.behaviour_logprobs[j + 1];
            }
            for (k, span) in s.spans.iter().enumerate() {
                // Position 0 is never predicted; a span can only start there with no prompt.
                let cols = span.positions.start.max(1) - 1..span.positions.end - 1;
                let skip = span.positions.len() - cols.len();
                if !span.sampler.is_neutral() && !cols.is_empty() {
                    let ids = |r: Range<usize>| s.input_ids[r].iter().map(|&x| i64::from(x));
                    sampled.push(SampledSpan {
                        row: r,
                        cols: cols.clone(),
                        sampler: span.sampler,
                        context: ids(0..span.positions.start + skip).collect(),
                        completion: ids(span.positions.start + skip..span.positions.end).collect(),
                    });
                }
                if span.behaviour == Behaviour::CurrentPolicy {
                    from_policy[row + cols.start..row + cols.end].fill(1.0);
                }
                if let Some(a) = item.advantages[k] {
                    rl_adv[row + cols.start..row + cols.end].fill(a);
                    rl_mask[row + cols.start..row + cols.end].fill(1.0);
                }
                if let Some(prompt) = &item.teacher_prompts[k] {
                    let completion = &s.input_ids[span.positions.clone()];
                    let scored = teacher(prompt, completion, &span.sampler)?;
                    for (c, lp) in cols.clone().zip(scored.into_iter().skip(skip)) {
                        teacher_lp[row + c] = lp;
                        opd_mask[row + c] = 1.0;
                    }
                }
            }
        }
        let counted_tokens = (0..cells)
            .filter(|&i| loss_mask[i] > 0.0 && (rl_mask[i] > 0.0 || opd_mask[i] > 0.0))
            .count();
        let shape = [rows as i64, width as i64];
        let t = |v: &[f32]| Tensor::from_slice(v).view(shape).to_device(device);
        let ids = |v: &[i64]| Tensor::from_slice(v).view(shape).to_device(device);
        Ok(MicroBatch {
            inputs: ids(&inputs),
            targets: ids(&targets),
            needs_policy_behaviour: from_policy.iter().any(|&x| x > 0.0),
            behaviour: t(&behaviour),
            from_policy: t(&from_policy),
            rl_advantages: t(&rl_adv),
            rl_mask: t(&rl_mask),
            teacher: t(&teacher_lp),
            opd_mask: t(&opd_mask),
            loss_mask: t(&loss_mask),
            served_by_current: Tensor::from_slice(&served_by_current)
                .view([rows as i64, 1])
                .to_device(device),
            sampled,
            counted_tokens,
            real_tokens,
        })
    }

    /// `logits` `[rows, width, vocab]` turned into those of the distributions the engine drew
    /// each span from (see [`Sampler::apply`]), columns outside a non-neutral span as they
    /// were, and `[rows, width]` f32 that is 0 where a target fell outside its truncated
    /// support. Differentiable; no copy when every span is neutral.
    pub fn sampled_logits(&self, logits: &Tensor) -> (Tensor, Tensor) {
        let (rows, width, _) = logits.size3().unwrap_or((0, 0, 0));
        let ones = |n: i64| Tensor::ones([n], (Kind::Float, logits.device()));
        if self.sampled.is_empty() {
            return (
                logits.shallow_clone(),
                ones(rows * width).view([rows, width]),
            );
        }
        let mut out = Vec::with_capacity(rows as usize);
        let mut kept = Vec::with_capacity(rows as usize);
        for r in 0..rows as usize {
            let row = logits.get(r as i64).to_kind(Kind::Float);
            let mut pieces = Vec::new();
            let mut kept_pieces = Vec::new();
            let mut at = 0i64;
            for span in self.sampled.iter().filter(|s| s.row == r) {
                let (start, end) = (span.cols.start as i64, span.cols.end as i64);
                if start > at {
                    pieces.push(row.narrow(0, at, start - at));
                    kept_pieces.push(ones(start - at));
                }
                let scored = row.narrow(0, start, end - start);
                let processed = span.sampler.apply(&scored, &span.context, &span.completion);
                pieces.push(processed.logits);
                kept_pieces.push(processed.kept);
                at = end;
            }
            if at < width {
                pieces.push(row.narrow(0, at, width - at));
                kept_pieces.push(ones(width - at));
            }
            out.push(Tensor::cat(&pieces, 0));
            kept.push(Tensor::cat(&kept_pieces, 0));
        }
        (Tensor::stack(&out, 0), Tensor::stack(&kept, 0))
    }

    /// Whether any span of the micro-batch is distilled.
    pub fn has_opd(&self) -> bool {
        self.opd_mask.sum(Kind::Float).double_value(&[]) > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_group_similar_lengths_within_the_token_budget() {
        let lengths = [10, 300, 12, 290, 11, 700];
        let groups = plan(&lengths, 800);
        // 700 alone (2 × 700 > 800); 300 + 290 (2 × 300 ≤ 800, 3 × 300 > 800); then the short ones.
        assert_eq!(groups, vec![vec![5], vec![1, 3], vec![2, 4, 0]]);
        for g in &groups {
            let longest = g.iter().map(|&i| lengths[i]).max().unwrap_or(0);
            assert!(g.len() == 1 || g.len() * longest <= 800);
        }
        let mut all: Vec<usize> = groups.concat();
        all.sort();
        assert_eq!(all, (0..lengths.len()).collect::<Vec<_>>());
    }

    #[test]
    fn a_sequence_over_the_budget_still_gets_a_micro_batch_of_its_own() {
        assert_eq!(plan(&[50, 5], 10), vec![vec![0], vec![1]]);
        assert!(plan(&[], 10).is_empty());
    }
}
