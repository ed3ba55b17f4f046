//! `judge-vote`: OpenClaw-RL's binary judge. Asks the judge model, `votes` times (config,
//! default 3), whether the step moved the task forward given what happened next; each answer
//! ends in `\boxed{1}`, `\boxed{-1}` or `\boxed{0}`. The majority wins; a tie, or no parsable
//! answer, scores 0.

use clawback_filter_sdk::text::boxed_score;
use clawback_filter_sdk::transcript::transcript;
use clawback_filter_sdk::{
    config, export_filter, judge, log, Evaluation, Filter, LogLevel, NextState, Step,
};

pub struct JudgeVote;

const INSTRUCTIONS: &str = "You are judging one step of an AI assistant working on a task. \
Read the conversation, the assistant's reply, and what happened next (tool results, the user's \
answer). Did the reply move the task forward? Think briefly, then end with exactly one of: \
\\boxed{1} (it helped), \\boxed{-1} (it hurt or failed), \\boxed{0} (it made no difference).";

impl Filter for JudgeVote {
    const DESCRIPTION: &'static str =
        "asks the judge model n times whether the step moved the task forward; majority vote";

    fn evaluate_step(step: Step, next: NextState) -> Evaluation {
        let votes: u32 = config("votes").unwrap_or(3).clamp(1, 15);
        let prompt = format!("{INSTRUCTIONS}\n\n{}", transcript(&step, &next, 8));
        match judge(&prompt, votes) {
            Ok(answers) => {
                let scores: Vec<Option<i8>> = answers.iter().map(|a| boxed_score(a)).collect();
                Evaluation::reward(f64::from(majority(&scores)))
                    .label("judge_votes", render(&scores))
            }
            Err(why) => {
                log(LogLevel::Warn, &format!("no judge answer: {why}"));
                Evaluation::none()
            }
        }
    }
}

export_filter!(JudgeVote);

/// The score most votes agree on; a tie, or no parsable vote, is 0. Unparsable votes count
/// for nobody.
pub fn majority(votes: &[Option<i8>]) -> i8 {
    let count = |score: i8| votes.iter().filter(|v| **v == Some(score)).count();
    let (up, down, zero) = (count(1), count(-1), count(0));
    if up > down && up > zero {
        1
    } else if down > up && down > zero {
        -1
    } else {
        0
    }
}

/// `+1,-1,?` for the labels.
pub fn render(votes: &[Option<i8>]) -> String {
    votes
        .iter()
        .map(|v| match v {
            Some(1) => "+1",
            Some(-1) => "-1",
            Some(_) => "0",
            None => "?",
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(answers: &[&str]) -> Vec<Option<i8>> {
        answers.iter().map(|a| boxed_score(a)).collect()
    }

    #[test]
    fn the_majority_of_judge_answers_wins() {
        let votes = parse(&[
            "The tool call listed the right directory and the user moved on. \\boxed{1}",
            "Reasonable step. \\boxed{1}",
            "The command failed with exit code 1, so \\boxed{-1}",
        ]);
        assert_eq!(majority(&votes), 1);
        assert_eq!(render(&votes), "+1,+1,-1");
    }

    #[test]
    fn ties_and_unparsable_answers_score_zero() {
        assert_eq!(majority(&parse(&["\\boxed{1}", "\\boxed{-1}"])), 0);
        assert_eq!(majority(&parse(&["I cannot tell.", "maybe good"])), 0);
        assert_eq!(
            majority(&parse(&["\\boxed{-1}", "unsure", "\\boxed{-1}"])),
            -1
        );
        assert_eq!(majority(&[]), 0);
    }
}
