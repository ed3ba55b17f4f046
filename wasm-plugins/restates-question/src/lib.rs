//! `restates-question`: flags a reply that gives the question back instead of answering it —
//! what a model rewarded for a form alone learned on the real model ("What is the capital of
//! France?" → "What's the capital of France?"). A reply restates its question when most of its
//! content words (stop words aside) are the question's own: at least `threshold` of them (the
//! plugin's config, default 0.75). −1 for a restatement, +1 for a reply that brings words of
//! its own; no opinion without a user question or a reply with content words.

use std::collections::HashSet;

use clawback_filter_sdk::{config, export_filter, Evaluation, Filter, NextState, Step, Trajectory};

pub struct RestatesQuestion;

/// The share of a reply's content words that are the question's, from which it restates it.
pub const THRESHOLD: f64 = 0.75;

impl Filter for RestatesQuestion {
    const DESCRIPTION: &'static str =
        "-1 when most of the reply's content words are the question's own (it restates it), else +1";
    const EVALUATES_TRAJECTORIES: bool = false;

    fn evaluate_step(step: Step, _next: NextState) -> Evaluation {
        let Some(question) = step.last_user_message() else {
            return Evaluation::none();
        };
        let Some(overlap) = overlap(question, &step.output.content) else {
            return Evaluation::none();
        };
        let threshold = config::<f64>("threshold").unwrap_or(THRESHOLD);
        let reward = if overlap >= threshold { -1.0 } else { 1.0 };
        Evaluation::reward(reward).label("overlap", format!("{overlap:.2}"))
    }

    fn evaluate_trajectory(_trajectory: Trajectory) -> Evaluation {
        Evaluation::none()
    }
}

export_filter!(RestatesQuestion);

/// The share of `reply`'s content words (counted with repeats) that are content words of
/// `question`; `None` when the reply has none.
pub fn overlap(question: &str, reply: &str) -> Option<f64> {
    let asked: HashSet<String> = content_words(question).collect();
    let (mut total, mut repeated) = (0usize, 0usize);
    for word in content_words(reply) {
        total += 1;
        repeated += usize::from(asked.contains(&word));
    }
    (total > 0).then(|| repeated as f64 / total as f64)
}

/// Words that carry content: lower-cased runs of letters and digits, without stop words and
/// with a plural's or possessive's `s` taken off ("days" and "day" are one word).
fn content_words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(|w| match w.strip_suffix('s') {
            Some(stem) if stem.len() > 2 && !stem.ends_with('s') => stem.to_owned(),
            _ => w,
        })
}

const STOP_WORDS: &[&str] = &[
    "a", "about", "an", "and", "are", "as", "at", "be", "by", "can", "could", "did", "do", "does",
    "for", "from", "had", "has", "have", "how", "i", "if", "in", "is", "it", "its", "me", "much",
    "many", "my", "of", "on", "or", "s", "should", "so", "tell", "that", "the", "there", "this",
    "to", "was", "were", "what", "when", "where", "which", "who", "why", "will", "with", "would",
    "you", "your",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn restates(question: &str, reply: &str) -> bool {
        overlap(question, reply).is_some_and(|o| o >= THRESHOLD)
    }

    #[test]
    fn the_question_given_back_is_a_restatement() {
        // The brief adapter's replies on the real model (issue 48).
        for (question, reply) in [
            (
                "What is the capital of France?",
                "What's the capital of France?",
            ),
            (
                "How many days are in a week?",
                "How many days are in a week?",
            ),
            (
                "Which ocean is the largest?",
                "The largest ocean is the largest ocean is the largest ocean is",
            ),
            (
                "Tell me about the history of the bicycle.",
                "The history of the bicycle is the story of the bicycle.",
            ),
        ] {
            assert!(restates(question, reply), "{reply}");
        }
    }

    #[test]
    fn an_answer_that_reuses_the_questions_words_is_not() {
        // The base model's replies to the same questions.
        for (question, reply) in [
            (
                "What is the capital of France?",
                "The capital of France is Paris.",
            ),
            (
                "How many days are in a week?",
                "A week is approximately 7 days.",
            ),
            (
                "Which ocean is the largest?",
                "The largest ocean is the Pacific Ocean, covering a third of the Earth.",
            ),
            (
                "Why is the sky blue?",
                "Sunlight is scattered by the air, blue light most.",
            ),
        ] {
            assert!(!restates(question, reply), "{reply}");
        }
    }

    #[test]
    fn a_reply_without_content_words_has_no_overlap() {
        assert_eq!(overlap("What is it?", "It is."), None);
        assert_eq!(overlap("What is it?", ""), None);
    }
}
