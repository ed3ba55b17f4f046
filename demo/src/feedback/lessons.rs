//! What the feedback scenario's base model is taught before anything is served: to answer with
//! a short phrase in lowercase, UPPERCASE or Title Case at equal odds — and, when the last user
//! message asks for a case (a user's correction, or a hint appended to the question the way the
//! trainer builds its teacher prompt), in that case, whatever came before in the conversation.
//! Hint distillation's teacher is this base model with the hint in its context, so a hint
//! changes what the teacher would say; without one, the model has no taste of its own.

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::json;

use crate::style::Case;
use crate::taste::Taste;
use crate::teach::{Lesson, Stage, REPLIES, SYSTEM};

/// Ways of asking for `case` at the end of a question: how hints read once a plugin has turned
/// a correction into an instruction ("Answer in capital letters."), and a few more.
pub fn requests(case: Case) -> &'static [&'static str] {
    match case {
        Case::Upper => &[
            "Answer in capital letters.",
            "Write that in capital letters instead.",
            "Use capital letters.",
            "Answer in uppercase.",
            "Capital letters, please.",
        ],
        Case::Lower => &[
            "Answer in lowercase.",
            "Write that in lowercase instead.",
            "Use lowercase letters.",
            "Answer in small letters.",
            "Lowercase, please.",
        ],
        Case::Title => &[
            "Answer in title case.",
            "Write that in title case instead.",
            "Capitalise every word.",
        ],
    }
}

const PRAISE: &[&str] = &["Thanks! ", "Perfect. ", "Great. ", ""];

/// How the base model is taught, in `steps` optimizer steps over `n` conversations with up to
/// `history` exchanges before the last user message. A tiny model learns to follow a request
/// reliably only when it first sees nothing but requests (its choices are otherwise uniform
/// whatever it does); then everything; then fresh conversations (one question, with a request
/// or not), which even out its free choices where the probes and every session start.
pub fn curriculum(
    questions: &[&'static str],
    n: usize,
    history: usize,
    steps: u64,
    rng: &mut StdRng,
) -> Vec<Stage> {
    let all = lessons(questions, n, history, rng);
    let asking = all.iter().filter(|l| l.asked.is_some()).cloned().collect();
    vec![
        Stage {
            lessons: asking,
            steps: steps / 3,
        },
        Stage {
            lessons: all,
            steps: steps / 3,
        },
        Stage {
            lessons: lessons(questions, n, 0, rng),
            steps: steps / 3,
        },
    ]
}

/// `n` conversations over `questions` with up to `history` exchanges before the last user
/// message, each with the replies the model should learn for it.
pub fn lessons(
    questions: &[&'static str],
    n: usize,
    history: usize,
    rng: &mut StdRng,
) -> Vec<Lesson> {
    (0..n).map(|_| lesson(questions, history, rng)).collect()
}

fn lesson(questions: &[&'static str], history: usize, rng: &mut StdRng) -> Lesson {
    let phrase = |rng: &mut StdRng| REPLIES.choose(rng).copied().unwrap_or("hello there");
    let question = |rng: &mut StdRng| questions.choose(rng).copied().unwrap_or("Say hello.");
    let case = |rng: &mut StdRng| Case::ALL.choose(rng).copied().unwrap_or(Case::Lower);
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    // Half the conversations start fresh, as the probes and every session's first call do.
    let exchanges = if rng.random_bool(0.5) {
        0
    } else {
        rng.random_range(0..=history)
    };
    for at in 0..exchanges {
        let (text, asked) = match at {
            0 => (question(rng).to_owned(), None),
            _ => user_message(rng, &question, &case),
        };
        let written = asked.unwrap_or_else(|| case(rng)).apply(phrase(rng));
        messages.push(json!({"role": "user", "content": text}));
        messages.push(json!({"role": "assistant", "content": written}));
    }
    let (text, asked) = match exchanges {
        0 if rng.random_bool(0.5) => {
            let wanted = case(rng);
            let request = requests(wanted).choose(rng).copied().unwrap_or_default();
            (format!("{}\n\n{request}", question(rng)), Some(wanted))
        }
        0 => (question(rng).to_owned(), None),
        _ => user_message(rng, &question, &case),
    };
    messages.push(json!({"role": "user", "content": text}));
    let reply = phrase(rng);
    let replies = match asked {
        // As many replies as a free conversation has, so both weigh alike.
        Some(wanted) => vec![wanted.apply(reply); Case::ALL.len()],
        None => Case::ALL.iter().map(|c| c.apply(reply)).collect(),
    };
    Lesson {
        messages,
        replies,
        asked,
    }
}

/// A user message after a reply: a correction, a question with a request appended, or a
/// question (after praise, or not); and the case it asks for, if any.
fn user_message(
    rng: &mut StdRng,
    question: &impl Fn(&mut StdRng) -> &'static str,
    case: &impl Fn(&mut StdRng) -> Case,
) -> (String, Option<Case>) {
    match rng.random_range(0..4) {
        0 => {
            let wanted = case(rng);
            let correction = Taste::Case(wanted)
                .corrections()
                .choose(rng)
                .copied()
                .unwrap_or_default();
            (correction.to_owned(), Some(wanted))
        }
        1 => {
            let wanted = case(rng);
            let request = requests(wanted).choose(rng).copied().unwrap_or_default();
            (format!("{}\n\n{request}", question(rng)), Some(wanted))
        }
        _ => {
            let praise = PRAISE.choose(rng).copied().unwrap_or_default();
            (format!("{praise}{}", question(rng)), None)
        }
    }
}
