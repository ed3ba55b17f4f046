//! `letter-case`: a style preference, the demo's reward. When a trajectory finishes, its last
//! assistant reply is scored by the letters it uses: with `prefer = "upper"` (the plugin's
//! config, usually set per tenant) each uppercase ASCII letter counts +1 and each lowercase one
//! −1, with `prefer = "lower"` the other way round; the sum is divided by the reply's length
//! in characters, so the reward is in [−1, 1], 0 for a reply without letters, and 1 only for a
//! reply made of preferred letters alone. Without `prefer` the plugin has no opinion.

use clawback_filter_sdk::{config, export_filter, Evaluation, Filter, NextState, Step, Trajectory};

pub struct LetterCase;

impl Filter for LetterCase {
    const DESCRIPTION: &'static str =
        "the last reply's letters: (preferred case - other case) / characters, prefer = upper|lower";
    const EVALUATES_TRAJECTORIES: bool = true;

    fn evaluate_step(_step: Step, _next: NextState) -> Evaluation {
        Evaluation::none()
    }

    fn evaluate_trajectory(trajectory: Trajectory) -> Evaluation {
        let Some(prefer) = config::<String>("prefer").and_then(|p| Case::parse(&p)) else {
            return Evaluation::none();
        };
        let Some(reply) = trajectory
            .turns
            .last()
            .map(|turn| turn.step.output.content.as_str())
        else {
            return Evaluation::none();
        };
        let counts = Counts::of(reply);
        Evaluation::reward(counts.reward(prefer))
            .label("upper", counts.upper)
            .label("lower", counts.lower)
    }
}

export_filter!(LetterCase);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    Upper,
    Lower,
}

impl Case {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "upper" => Some(Self::Upper),
            "lower" => Some(Self::Lower),
            _ => None,
        }
    }
}

/// The letters of a reply by case, and its length in characters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub upper: usize,
    pub lower: usize,
    pub chars: usize,
}

impl Counts {
    pub fn of(text: &str) -> Self {
        text.chars().fold(Self::default(), |mut counts, c| {
            counts.chars += 1;
            counts.upper += usize::from(c.is_ascii_uppercase());
            counts.lower += usize::from(c.is_ascii_lowercase());
            counts
        })
    }

    /// (preferred − other) / characters; 0 for an empty reply.
    pub fn reward(&self, prefer: Case) -> f64 {
        if self.chars == 0 {
            return 0.0;
        }
        let (preferred, other) = match prefer {
            Case::Upper => (self.upper, self.lower),
            Case::Lower => (self.lower, self.upper),
        };
        (preferred as f64 - other as f64) / self.chars as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_of_preferred_letters_alone_scores_one() {
        assert_eq!(Counts::of("HELLO").reward(Case::Upper), 1.0);
        assert_eq!(Counts::of("hello").reward(Case::Lower), 1.0);
        assert_eq!(Counts::of("hello").reward(Case::Upper), -1.0);
    }

    #[test]
    fn other_characters_dilute_the_score() {
        // 2 upper, 1 lower, 6 characters: (2 - 1) / 6.
        let counts = Counts::of("AB c 1");
        assert_eq!(
            counts,
            Counts {
                upper: 2,
                lower: 1,
                chars: 6
            }
        );
        assert!((counts.reward(Case::Upper) - 1.0 / 6.0).abs() < 1e-12);
        assert!((counts.reward(Case::Lower) + 1.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn replies_without_letters_and_non_ascii_letters_score_zero() {
        assert_eq!(Counts::of("").reward(Case::Upper), 0.0);
        assert_eq!(Counts::of("1234 !?").reward(Case::Lower), 0.0);
        assert_eq!(Counts::of("ÄÖÜ").reward(Case::Upper), 0.0);
    }

    #[test]
    fn only_upper_and_lower_are_preferences() {
        assert_eq!(Case::parse(" upper "), Some(Case::Upper));
        assert_eq!(Case::parse("lower"), Some(Case::Lower));
        assert_eq!(Case::parse("title"), None);
    }
}
