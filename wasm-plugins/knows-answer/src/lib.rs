//! `knows-answer`: whether a reply gives a known answer, for questions with a checkable one
//! ("What is the capital of France?" → `Paris`). The answer comes from trusted metadata
//! (`metadata.answer`, set by the handshake API or a gate's prompt set, never by the agent's
//! body); `|` separates the forms that count (`7|seven`). +1 when the reply holds one of them as
//! whole words (any case: `7` is in "7 days", not in "17 days"), −1 when it holds none. Without
//! `metadata.answer` the plugin has no opinion.

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step, Trajectory};

pub struct KnowsAnswer;

impl Filter for KnowsAnswer {
    const DESCRIPTION: &'static str =
        "the reply holds metadata.answer (forms split by |) as whole words: +1, else -1";
    const EVALUATES_TRAJECTORIES: bool = false;

    fn evaluate_step(step: Step, _next: NextState) -> Evaluation {
        let Some(answer) = step.metadata("answer") else {
            return Evaluation::none();
        };
        match found(&step.output.content, answer) {
            Some(form) => Evaluation::reward(1.0).label("found", form),
            None => Evaluation::reward(-1.0).label("found", "none"),
        }
    }

    fn evaluate_trajectory(_trajectory: Trajectory) -> Evaluation {
        Evaluation::none()
    }
}

export_filter!(KnowsAnswer);

/// The first form of `answer` that `reply` holds as whole words.
pub fn found<'a>(reply: &str, answer: &'a str) -> Option<&'a str> {
    let reply = words(reply);
    answer
        .split('|')
        .map(str::trim)
        .filter(|form| !form.is_empty())
        .find(|form| {
            let form = words(form);
            !form.is_empty() && reply.windows(form.len()).any(|w| w == form.as_slice())
        })
}

/// The lower-cased runs of letters and digits of `text`; a decimal point or a thousands comma
/// inside a number stays in it (`3.5`, `1,000`).
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let inside_number = (c == '.' || c == ',')
            && current.chars().last().is_some_and(|l| l.is_ascii_digit())
            && chars.peek().is_some_and(char::is_ascii_digit);
        if c.is_alphanumeric() || inside_number {
            current.extend(c.to_lowercase());
        } else if !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_counts_as_whole_words_in_any_case() {
        assert_eq!(
            found("The capital of France is Paris.", "Paris"),
            Some("Paris")
        );
        assert_eq!(found("PARIS, of course", "paris"), Some("paris"));
        assert_eq!(found("A week has 7 days.", "7|seven"), Some("7"));
        assert_eq!(found("A week has seven days.", "7|seven"), Some("seven"));
        assert_eq!(
            found("It is the Pacific Ocean.", "Pacific Ocean|Pacific"),
            Some("Pacific Ocean")
        );
    }

    #[test]
    fn a_restated_question_or_a_near_miss_is_no_answer() {
        assert_eq!(found("What's the capital of France?", "Paris"), None);
        assert_eq!(found("There are 17 of them.", "7|seven"), None);
        assert_eq!(found("Parisian food is good.", "Paris"), None);
        assert_eq!(found("anything", " | "), None);
    }

    #[test]
    fn numbers_keep_their_points_and_commas() {
        assert_eq!(
            words("About 3.5 cups, or 1,000 ml."),
            ["about", "3.5", "cups", "or", "1,000", "ml"]
        );
        assert_eq!(found("It is 3.5 km.", "3.5"), Some("3.5"));
        assert_eq!(found("It is 3 km.", "3.5"), None);
    }
}
