//! The form of a reply — one short sentence, or a list of points — as the personal scenario's
//! users and probes read it: by counting, never by asking a model.

use std::sync::LazyLock;

use regex::Regex;

/// How a reply is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// One sentence of at most [`BRIEF_WORDS`] words, on one line.
    Brief,
    /// At least [`LIST_ITEMS`] lines that open with a list marker (`-`, `*`, `•`, `1.`, `2)`).
    List,
}

/// The most words a brief reply has: a short sentence ("The capital of France is Paris." is six;
/// "To sleep better, keep a regular bedtime and avoid screens late at night." is thirteen).
pub const BRIEF_WORDS: usize = 30;
/// The fewest items that make a list.
pub const LIST_ITEMS: usize = 3;

/// A line that opens a list item.
static ITEM: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*(?:[-*•]|\d{1,2}[.)])\s+\S").expect("a valid item pattern"));
/// The end of a sentence: `.`, `!` or `?` (repeated or not) before a space or the end, not
/// after a lone capital (an initial, "J. S. Bach") or a digit ("3.5" has no space after it).
static SENTENCE_END: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[^\sA-Z][.!?]+(?:\s|$)").expect("a valid sentence pattern"));

impl Form {
    pub fn as_str(self) -> &'static str {
        match self {
            Form::Brief => "one short sentence",
            Form::List => "a list",
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
                    && SENTENCE_END.find_iter(text).count() <= 1
            }
            Form::List => text.lines().filter(|l| ITEM.is_match(l)).count() >= LIST_ITEMS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
