//! `correction-hint`: a directive hint read from the user's own correction, with no judge. When
//! the user's next message corrects the step (the SDK's [`reaction`]: a correction or a
//! complaint), the sentences of it that ask for something — "please …", "could you …",
//! "… instead" — become the hint, as an instruction to the assistant: "No, please answer in
//! capital letters. Name a city." gives "Answer in capital letters." A correction that asks for
//! nothing in particular ("That's wrong.") gives no hint; that it missed is a reward's business
//! (`user-feedback`). Where a judge model should write the hint from the whole exchange, as
//! OpenClaw-RL does, use `hint-extractor`.

use clawback_filter_sdk::reaction::{reaction, Reaction};
use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

pub struct CorrectionHint;

impl Filter for CorrectionHint {
    const DESCRIPTION: &'static str =
        "the user's correction, as a directive hint: its sentences that ask for something";

    fn evaluate_step(step: Step, next: NextState) -> Evaluation {
        let Some(reply) = next.user_message.as_deref() else {
            return Evaluation::none();
        };
        match reaction(step.last_user_message(), reply) {
            Reaction::Corrects | Reaction::Complains => match directive(reply) {
                Some(hint) => Evaluation::hint(hint),
                None => Evaluation::none(),
            },
            _ => Evaluation::none(),
        }
    }
}

export_filter!(CorrectionHint);

/// Hints this short say nothing.
const MIN_HINT_CHARS: usize = 10;
/// Directive sentences kept, at most.
const MAX_SENTENCES: usize = 2;

/// What opens a correction and is not part of the request ("No, please …"), when punctuation
/// follows it.
const OPENERS: &[&str] = &[
    "no",
    "nope",
    "actually",
    "wrong",
    "incorrect",
    "hmm",
    "well",
    "ugh",
    "come on",
];

/// Words that make a sentence a request, taken off its front ("could you write …" → "write …").
const ASKING: &[&str] = &[
    "please",
    "could you please",
    "could you",
    "can you please",
    "can you",
    "would you please",
    "would you",
    "will you",
    "i want you to",
    "i'd like you to",
    "i would like you to",
    "i need you to",
    "you should",
    "you need to",
    "you must",
    "make sure to",
    "make sure you",
    "remember to",
];

/// The sentences of `reply` that ask for something, as one instruction; `None` when it asks for
/// nothing.
pub fn directive(reply: &str) -> Option<String> {
    let wanted: Vec<String> = sentences(reply)
        .filter_map(request)
        .take(MAX_SENTENCES)
        .collect();
    let hint = wanted.join(" ");
    (hint.chars().count() > MIN_HINT_CHARS).then_some(hint)
}

/// `sentence` as an instruction, when it asks for something: its opener and its asking words
/// taken off, a trailing "please" too, starting with a capital and ending with a full stop.
fn request(sentence: &str) -> Option<String> {
    let mut rest = sentence.trim();
    const PUNCTUATION: [char; 7] = [',', ':', ';', '-', '—', '!', '.'];
    for opener in OPENERS {
        if let Some(after) = strip_word(rest, opener).filter(|a| a.starts_with(PUNCTUATION)) {
            rest = after.trim_start_matches(PUNCTUATION).trim_start();
            break;
        }
    }
    let body = rest.trim_end_matches(['.', '?', '!', ' ']);
    let (body, asked) = match ASKING.iter().find_map(|w| strip_word(body, w)) {
        Some(after) => (after.trim_start_matches([',', ' ']), true),
        None => (body, false),
    };
    let (body, polite) = match strip_suffix_word(body, "please") {
        Some(before) => (before.trim_end_matches([',', ' ']), true),
        None => (body, false),
    };
    let instead = body
        .to_lowercase()
        .split_whitespace()
        .any(|w| w == "instead");
    if !(asked || polite || instead) || body.is_empty() {
        return None;
    }
    let mut chars = body.chars();
    let first = chars.next()?;
    Some(format!("{}{}.", first.to_uppercase(), chars.as_str()))
}

/// The text after `word` when `text` starts with it as a whole word (any case).
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let head = text.get(..word.len())?;
    let rest = &text[word.len()..];
    let whole = rest.is_empty() || !rest.starts_with(|c: char| c.is_alphanumeric() || c == '\'');
    (head.eq_ignore_ascii_case(word) && whole).then_some(rest)
}

/// The text before `word` when `text` ends with it as a whole word (any case).
fn strip_suffix_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let cut = text.len().checked_sub(word.len())?;
    let tail = text.get(cut..)?;
    let before = &text[..cut];
    let whole = before.is_empty() || before.ends_with(|c: char| !c.is_alphanumeric());
    (tail.eq_ignore_ascii_case(word) && whole).then_some(before)
}

/// The sentences of `text`: cut after `.`, `?` or `!` followed by a space or the end.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text.trim();
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let bytes = rest.as_bytes();
        let end = (0..bytes.len())
            .find(|&i| {
                matches!(bytes[i], b'.' | b'?' | b'!')
                    && bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace())
            })
            .map_or(rest.len(), |i| i + 1);
        let (sentence, after) = rest.split_at(end);
        rest = after.trim_start();
        Some(sentence)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_correction_that_asks_for_something_becomes_an_instruction() {
        for (reply, hint) in [
            (
                "No, please answer in capital letters. Name a city.",
                "Answer in capital letters.",
            ),
            (
                "Could you write that in lowercase instead? Describe the sea softly.",
                "Write that in lowercase instead.",
            ),
            (
                "That's not what I asked for. Please use capital letters.",
                "Use capital letters.",
            ),
            (
                "No, I meant only the api/ folder. Please leave the tests alone.",
                "Leave the tests alone.",
            ),
            (
                "Wrong file — use src/main.rs instead.",
                "Wrong file — use src/main.rs instead.",
            ),
            (
                "Actually, can you keep the old name, please?",
                "Keep the old name.",
            ),
            // The personal demo's users (demo/src/taste.rs) on a real model's replies.
            (
                "No, please answer in one short sentence.",
                "Answer in one short sentence.",
            ),
            (
                "Could you give me that as a bulleted list instead?",
                "Give me that as a bulleted list instead.",
            ),
            (
                "That's not what I asked for. Please write it as a list of points.",
                "Write it as a list of points.",
            ),
            // ... and to a reply that gave their question back.
            (
                "That's not an answer to my question. Please answer it in one short sentence.",
                "Answer it in one short sentence.",
            ),
        ] {
            assert_eq!(directive(reply).as_deref(), Some(hint), "{reply}");
        }
    }

    #[test]
    fn a_reply_that_asks_for_nothing_gives_no_hint() {
        for reply in [
            "That's wrong.",
            "No. Name a city.",
            "It still doesn't compile.",
            "Please.",
        ] {
            assert_eq!(directive(reply), None, "{reply}");
        }
    }

    #[test]
    fn words_are_matched_whole() {
        assert_eq!(strip_word("nothing to see", "no"), None);
        assert_eq!(strip_word("No, thanks", "no"), Some(", thanks"));
        assert_eq!(
            strip_suffix_word("keep it simple please", "please"),
            Some("keep it simple ")
        );
        assert_eq!(strip_suffix_word("displease", "please"), None);
    }
}
