//! `hint-extractor`: asks the judge model, `votes` times (config, default 3), for a score and a
//! 1–3 sentence hint between `[HINT_START]` and `[HINT_END]` saying what the assistant should
//! have done. Keeps the longest hint over 10 characters among the positive votes (`\boxed{1}`:
//! "a hint would help"); otherwise no opinion. It gives a directive hint, not a reward.

use clawback_filter_sdk::text::{between, boxed_score};
use clawback_filter_sdk::transcript::transcript;
use clawback_filter_sdk::{
    config, export_filter, judge, log, Evaluation, Filter, LogLevel, NextState, Step,
};

pub struct HintExtractor;

const INSTRUCTIONS: &str = "You are reviewing one step of an AI assistant, given what happened \
next (tool results, the user's answer). If what happened next shows something the assistant \
should have done differently, answer \\boxed{1} and write a 1-3 sentence hint to the assistant \
between [HINT_START] and [HINT_END]. Otherwise answer \\boxed{-1}.";

/// Hints this short say nothing.
const MIN_HINT_CHARS: usize = 10;

impl Filter for HintExtractor {
    const DESCRIPTION: &'static str =
        "asks the judge for a directive hint; keeps the longest one among positive votes";

    fn evaluate_step(step: Step, next: NextState) -> Evaluation {
        let votes: u32 = config("votes").unwrap_or(3).clamp(1, 15);
        let prompt = format!("{INSTRUCTIONS}\n\n{}", transcript(&step, &next, 8));
        match judge(&prompt, votes) {
            Ok(answers) => match best_hint(&answers) {
                Some(hint) => Evaluation::hint(hint).label("judge_answers", answers.len()),
                None => Evaluation::none(),
            },
            Err(why) => {
                log(LogLevel::Warn, &format!("no judge answer: {why}"));
                Evaluation::none()
            }
        }
    }
}

export_filter!(HintExtractor);

/// The longest hint over [`MIN_HINT_CHARS`] among the answers that voted `\boxed{1}`.
pub fn best_hint(answers: &[String]) -> Option<String> {
    answers
        .iter()
        .filter(|a| boxed_score(a) == Some(1))
        .filter_map(|a| between(a, "[HINT_START]", "[HINT_END]"))
        .filter(|hint| hint.chars().count() > MIN_HINT_CHARS)
        .max_by_key(|hint| hint.chars().count())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_hint_of_a_positive_vote_is_kept() {
        let answers = vec![
            "\\boxed{1} [HINT_START]Run the tests first.[HINT_END]".to_owned(),
            "The user had to repeat the path. \\boxed{1}\n[HINT_START]Use the path the user gave, \
             /srv/app/config.yaml, instead of guessing one.[HINT_END]"
                .to_owned(),
            "[HINT_START]A much longer hint that comes from a negative vote and must be ignored entirely.[HINT_END] \\boxed{-1}".to_owned(),
        ];
        assert_eq!(
            best_hint(&answers).as_deref(),
            Some("Use the path the user gave, /srv/app/config.yaml, instead of guessing one.")
        );
    }

    #[test]
    fn short_or_missing_hints_give_nothing() {
        let answers = vec![
            "\\boxed{1} [HINT_START]Be nicer[HINT_END]".to_owned(),
            "\\boxed{1} no markers at all".to_owned(),
            "\\boxed{-1}".to_owned(),
        ];
        assert_eq!(best_hint(&answers), None);
    }
}
