//! `exact-answer`: a verifiable outcome reward. When a trajectory finishes, its final answer —
//! GSM8K's `#### 42`, else the last `\boxed{...}`, else the last number of the last assistant
//! reply — is compared with `metadata.answer`: +1 when equal (numbers compared as numbers), −1
//! otherwise. A trajectory without `metadata.answer` gets no opinion; steps get none either.

use clawback_filter_sdk::text::last_boxed;
use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step, Trajectory};

pub struct ExactAnswer;

impl Filter for ExactAnswer {
    const DESCRIPTION: &'static str =
        "final answer (#### / \\boxed{} / last number) vs metadata.answer: +1 or -1";
    const EVALUATES_TRAJECTORIES: bool = true;

    fn evaluate_step(_step: Step, _next: NextState) -> Evaluation {
        Evaluation::none()
    }

    fn evaluate_trajectory(trajectory: Trajectory) -> Evaluation {
        let Some(expected) = trajectory.metadata("answer") else {
            return Evaluation::none();
        };
        let reply = trajectory
            .turns
            .iter()
            .rev()
            .map(|turn| turn.step.output.content.as_str())
            .find(|content| !content.trim().is_empty());
        match reply.and_then(final_answer) {
            Some(found) if same_answer(&found, expected) => {
                Evaluation::reward(1.0).label("answer", found)
            }
            Some(found) => Evaluation::reward(-1.0).label("answer", found),
            None => Evaluation::reward(-1.0).label("answer", "none"),
        }
    }
}

export_filter!(ExactAnswer);

/// The answer a reply gives: after `####`, in the last `\boxed{}`, or its last number.
pub fn final_answer(reply: &str) -> Option<String> {
    if let Some(at) = reply.rfind("####") {
        let line = reply[at + 4..].lines().next().unwrap_or_default().trim();
        if !line.is_empty() {
            return Some(line.to_owned());
        }
    }
    if let Some(boxed) = last_boxed(reply) {
        return Some(boxed.to_owned());
    }
    last_number(reply)
}

fn last_number(text: &str) -> Option<String> {
    let mut found = None;
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let continues = c.is_ascii_digit()
            || ((c == '.' || c == ',')
                && !current.is_empty()
                && chars.peek().is_some_and(char::is_ascii_digit))
            || (c == '-' && current.is_empty() && chars.peek().is_some_and(char::is_ascii_digit));
        if continues {
            current.push(c);
        } else if !current.is_empty() {
            found = Some(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        found = Some(current);
    }
    found
}

/// Equal as numbers when both read as numbers (`1,000` = `1000.0`, `$18` = `18`), else equal as
/// trimmed text, ignoring case.
pub fn same_answer(found: &str, expected: &str) -> bool {
    match (number(found), number(expected)) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-6 * b.abs().max(1.0),
        _ => found.trim().eq_ignore_ascii_case(expected.trim()),
    }
}

fn number(text: &str) -> Option<f64> {
    let cleaned: String = text
        .trim()
        .trim_start_matches('$')
        .trim_end_matches(['.', '%'])
        .chars()
        .filter(|c| *c != ',')
        .collect();
    cleaned.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsm8k_boxed_and_last_number_answers_are_read() {
        let gsm8k = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72";
        assert_eq!(final_answer(gsm8k).as_deref(), Some("72"));
        let boxed = "So the total is $3 \\times 6 = 18$ dollars. The answer is \\boxed{18}.";
        assert_eq!(final_answer(boxed).as_deref(), Some("18"));
        let plain = "She has 5 apples, gives away 2, so she ends up with 3.";
        assert_eq!(final_answer(plain).as_deref(), Some("3"));
        assert_eq!(
            final_answer("It costs 1,250.50 dollars").as_deref(),
            Some("1,250.50")
        );
        assert_eq!(final_answer("I don't know."), None);
    }

    #[test]
    fn numbers_compare_as_numbers() {
        assert!(same_answer("1,000", "1000"));
        assert!(same_answer("$18.00", "18"));
        assert!(same_answer("72", "72"));
        assert!(!same_answer("71", "72"));
        assert!(same_answer("Paris", " paris "));
    }
}
