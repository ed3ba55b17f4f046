//! The arithmetic scenario's task: two-digit sums ("What is 47 + 38?"), a fresh problem for every
//! group, its answer handed to the handshake as trusted metadata for the `exact_answer` plugin;
//! and the held-out problems whose greedy answers measure each tenant's accuracy.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::chat::{self, Talk};
use crate::taste::Taste;
use crate::DemoTenant;

/// One problem and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub question: String,
    pub answer: String,
}

/// The problem `index` of a stream: two numbers from 10 to 99. Streams (a tenant's rounds, the
/// held-out set) are seeded apart, so no group's problem is chosen by looking at another's.
pub fn problem(stream: u64, index: u64) -> Problem {
    let mut rng = StdRng::seed_from_u64(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index);
    let (a, b) = (rng.random_range(10..=99u32), rng.random_range(10..=99u32));
    Problem {
        question: format!("What is {a} + {b}?"),
        answer: (a + b).to_string(),
    }
}

/// The stream of the held-out problems, asked only by the probes.
pub const HELD_OUT: u64 = u64::MAX;

/// The stream of `tenant`'s groups in a run seeded with `seed`.
pub fn stream(seed: u64, tenant: usize) -> u64 {
    seed.wrapping_mul(31).wrapping_add(tenant as u64)
}

/// Whether `reply` gives `answer`: its last number, as the `exact_answer` plugin reads a reply
/// without `####` or `\boxed{}` ("47 + 38 = 85." gives 85; "1,000" is 1000).
pub fn answers(reply: &str, answer: &str) -> bool {
    let mut last = None;
    let mut current = String::new();
    for c in reply.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() || (c == ',' && !current.is_empty()) {
            current.push(c);
        } else if !current.is_empty() {
            last = Some(std::mem::take(&mut current));
        }
    }
    last.is_some_and(|n| n.trim_end_matches(',').replace(',', "") == answer)
}

/// The two tenants: each its own adapter learning the same task from its own problems — one
/// run, two replicates.
pub fn tenants(suffix: Option<&str>) -> [DemoTenant; 2] {
    let tenant = |base: &str| DemoTenant {
        name: match suffix {
            Some(s) => format!("{base}-{s}"),
            None => base.to_owned(),
        },
        key: format!("sk-demo-{base}-{}", suffix.unwrap_or("local")),
        prefers: Taste::RightAnswers,
        prompts: &[],
        probes: &[],
    };
    [tenant("ada"), tenant("blaise")]
}

/// A tenant's greedy answers to the held-out sums at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Accuracy {
    /// The adapter version that answered most of them; 0 for the base model.
    pub version: u64,
    pub asked: usize,
    pub right: usize,
}

impl Accuracy {
    pub fn rate(&self) -> f64 {
        self.right as f64 / self.asked.max(1) as f64
    }
}

/// `n` held-out sums asked of `tenant`'s live model through `sidecar`, greedily (temperature
/// 0: the accuracy of its most likely answer), as side turns that end their trajectory —
/// recorded, never trained on. What was found, and the failures as the caller saw them.
pub async fn accuracy(
    client: &reqwest::Client,
    sidecar: &str,
    tenant: &DemoTenant,
    talk: Talk,
    n: usize,
) -> (Accuracy, Vec<String>) {
    let greedy = Talk {
        sampling: chat::Sampling {
            temperature: 0.0,
            ..talk.sampling
        },
        ..talk
    };
    let mut calls = tokio::task::JoinSet::new();
    for index in 0..n as u64 {
        let problem = problem(HELD_OUT, index);
        let (client, base_url, key) = (client.clone(), format!("{sidecar}/v1"), tenant.key.clone());
        calls.spawn(async move {
            let headers = [("x-turn-type", "side"), ("x-clawback-done", "true")];
            let messages = greedy.opening(&problem.question);
            let reply = chat::complete(
                &client,
                &base_url,
                &key,
                &messages,
                greedy.sampling,
                &headers,
            )
            .await;
            reply.map(|reply| (reply.version(), answers(&reply.content, &problem.answer)))
        });
    }
    let mut versions = std::collections::BTreeMap::<u64, usize>::new();
    let (mut found, mut failures) = (Accuracy::default(), Vec::new());
    while let Some(joined) = calls.join_next().await {
        match joined.map_err(|e| format!("a probe's task failed: {e}")) {
            Ok(Ok((version, right))) => {
                found.asked += 1;
                found.right += usize::from(right);
                *versions.entry(version).or_default() += 1;
            }
            Ok(Err(failure)) | Err(failure) => failures.push(failure),
        }
    }
    found.version = chat::most_common_version(versions);
    (found, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_two_digit_sums_the_same_for_the_same_stream_and_index() {
        let p = problem(3, 7);
        assert_eq!(p, problem(3, 7));
        assert_ne!(p, problem(4, 7));
        let (a, b) = p
            .question
            .trim_start_matches("What is ")
            .trim_end_matches('?')
            .split_once(" + ")
            .unwrap();
        let (a, b): (u32, u32) = (a.parse().unwrap(), b.parse().unwrap());
        assert!((10..100).contains(&a) && (10..100).contains(&b));
        assert_eq!(p.answer, (a + b).to_string());
    }

    #[test]
    fn a_reply_answers_with_its_last_number() {
        assert!(answers("47 + 38 = 85.", "85"));
        assert!(answers("The answer is 85", "85"));
        assert!(answers("That makes 1,085 in all.", "1085"));
        assert!(!answers("85 is close, but it is 86.", "85"));
        assert!(!answers("I don't know.", "85"));
    }
}
