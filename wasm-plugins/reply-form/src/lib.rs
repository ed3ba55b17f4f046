//! `reply-form`: whether a reply is laid out the way a tenant's users asked — by counting, never
//! by asking a model. `form` (the plugin's config, usually set per tenant) names it: `brief`,
//! one sentence of at most 30 words on one line; `list`, at least three lines that open with a
//! list marker (`-`, `*`, `•`, `1.`, `2)`). +1 when the last reply fits, −1 when it does not;
//! without `form` the plugin has no opinion. The same rules as the personal scenario's users
//! and probes (`demo/src/form.rs`).

use clawback_filter_sdk::{config, export_filter, Evaluation, Filter, NextState, Step, Trajectory};

pub struct ReplyForm;

impl Filter for ReplyForm {
    const DESCRIPTION: &'static str =
        "the reply fits form = brief (one sentence, <= 30 words) | list (>= 3 marked lines): +1, else -1";
    const EVALUATES_TRAJECTORIES: bool = false;

    fn evaluate_step(step: Step, _next: NextState) -> Evaluation {
        let Some(form) = config::<String>("form").and_then(|f| Form::parse(&f)) else {
            return Evaluation::none();
        };
        let fits = form.fits(&step.output.content);
        Evaluation::reward(if fits { 1.0 } else { -1.0 }).label("form", form.as_str())
    }

    fn evaluate_trajectory(_trajectory: Trajectory) -> Evaluation {
        Evaluation::none()
    }
}

export_filter!(ReplyForm);

/// The most words a brief reply has.
pub const BRIEF_WORDS: usize = 30;
/// The fewest items that make a list.
pub const LIST_ITEMS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Brief,
    List,
}

impl Form {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "brief" => Some(Self::Brief),
            "list" => Some(Self::List),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Form::Brief => "brief",
            Form::List => "list",
        }
    }

    /// Whether `text` is written in this form.
    pub fn fits(self, text: &str) -> bool {
        let text = text.trim();
        match self {
            Form::Brief => {
                !text.is_empty()
                    && !text.contains('\n')
                    && text.split_whitespace().count() <= BRIEF_WORDS
                    && sentence_ends(text) <= 1
            }
            Form::List => text.lines().filter(|line| is_item(line)).count() >= LIST_ITEMS,
        }
    }
}

/// A line that opens a list item: a marker (`-`, `*`, `•`, or one or two digits and `.` or
/// `)`), white space, then text.
fn is_item(line: &str) -> bool {
    let line = line.trim_start();
    let rest = if let Some(rest) = line.strip_prefix(['-', '*', '•']) {
        rest
    } else {
        let digits = line.chars().take_while(char::is_ascii_digit).count();
        if !(1..=2).contains(&digits) {
            return false;
        }
        match line[digits..].strip_prefix(['.', ')']) {
            Some(rest) => rest,
            None => return false,
        }
    };
    rest.starts_with(char::is_whitespace) && !rest.trim().is_empty()
}

/// The ends of sentences: a run of `.`, `!` or `?` before white space or the end, not after
/// white space or a lone capital (an initial, "J. S. Bach"); a point between digits ("3.5") has
/// no space after it.
fn sentence_ends(text: &str) -> usize {
    let chars: Vec<char> = text.chars().collect();
    let mut ends = 0;
    let mut i = 0;
    while i < chars.len() {
        if matches!(chars[i], '.' | '!' | '?') && i > 0 {
            let before = chars[i - 1];
            let mut j = i;
            while j < chars.len() && matches!(chars[j], '.' | '!' | '?') {
                j += 1;
            }
            let at_break = j == chars.len() || chars[j].is_whitespace();
            if at_break && !before.is_whitespace() && !before.is_ascii_uppercase() {
                ends += 1;
            }
            i = j;
        } else {
            i += 1;
        }
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    // The same cases as demo/src/form.rs: the two must agree.
    #[test]
    fn one_short_sentence_is_brief_and_more_is_not() {
        for brief in [
            "The capital of France is Paris.",
            "Water boils at 100 °C at sea level!",
            "Try a regular bedtime, a dark room and no screens for an hour before sleep.",
            "It was written by J. S. Bach in 1723",
            "About 3.5 cups.",
        ] {
            assert!(Form::Brief.fits(brief), "{brief}");
        }
        for not in [
            "The capital of France is Paris. It is also its largest city.",
            "Paris.\nIt is the capital.",
            "",
            &"word ".repeat(31),
            "1. Rest\n2. Water\n3. Sleep",
        ] {
            assert!(!Form::Brief.fits(not), "{not}");
        }
    }

    #[test]
    fn three_marked_lines_are_a_list() {
        for list in [
            "Here are some tips:\n\n1. Rest\n2. Drink water\n3. Sleep early",
            "- sunscreen\n- a towel\n- water\n- a book",
            "*  Pack a towel.\n*  Pack sunscreen.\n*  Pack water.",
            "• one\n• two\n• three",
            "1) first\n2) second\n3) third",
        ] {
            assert!(Form::List.fits(list), "{list}");
        }
        for not in [
            "1. Rest\n2. Drink water",
            "Rest, drink water and sleep early.",
            "-not an item\n-nor this\n-nor this",
            "2026. A year.\n2027. Another.\n2028. And one more.",
        ] {
            assert!(!Form::List.fits(not), "{not}");
        }
    }

    #[test]
    fn only_brief_and_list_are_forms() {
        assert_eq!(Form::parse(" brief "), Some(Form::Brief));
        assert_eq!(Form::parse("list"), Some(Form::List));
        assert_eq!(Form::parse("poem"), None);
    }
}
