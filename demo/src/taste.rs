//! What a tenant's users want from every reply — a letter case (the tiny model's scenarios), a
//! form (the personal scenario's) or the right answer (the arithmetic scenario's): whether a
//! reply fits it, what a user says when one does not, and the hint such a correction becomes.

use crate::form::Form;
use crate::style::Case;

/// A tenant's taste.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Taste {
    Case(Case),
    Form(Form),
    /// The right answer to each problem. A reply alone cannot tell: the problem's answer,
    /// given to the handshake, decides (the `exact_answer` plugin, the arithmetic probes).
    RightAnswers,
}

impl Taste {
    /// In words: `upper`, `lower` (the `letter_case` plugin's `prefer`), `one short sentence`.
    pub fn as_str(self) -> &'static str {
        match self {
            Taste::Case(case) => case.as_str(),
            Taste::Form(form) => form.as_str(),
            Taste::RightAnswers => "right answers",
        }
    }

    /// The `form` the gate's `reply_form` check reads, for a taste it can check.
    pub fn gate_form(self) -> Option<&'static str> {
        match self {
            Taste::Form(Form::Brief) => Some("brief"),
            Taste::Form(Form::List) => Some("list"),
            Taste::Case(_) | Taste::RightAnswers => None,
        }
    }

    /// Whether `reply` is what the user wanted (never, for [`Taste::RightAnswers`]: that takes
    /// the problem).
    pub fn fits(self, reply: &str) -> bool {
        match self {
            Taste::Case(case) => Case::of(reply) == Some(case),
            Taste::Form(form) => form.fits(reply),
            Taste::RightAnswers => false,
        }
    }

    /// What a user who wants this says when a reply missed it. Each is a correction the
    /// `user-feedback` plugin reads as one (−1) and that `correction-hint` turns into a hint.
    pub fn corrections(self) -> &'static [&'static str] {
        match self {
            Taste::Case(Case::Upper) => &[
                "No, please answer in capital letters.",
                "Could you write that in capital letters instead?",
                "That's not what I asked for. Please use capital letters.",
            ],
            Taste::Case(Case::Lower) => &[
                "No, please answer in lowercase.",
                "Could you write that in lowercase instead?",
                "That's not what I asked for. Please use lowercase letters.",
            ],
            Taste::Case(Case::Title) => &[
                "No, please answer in title case.",
                "Could you write that in title case instead?",
            ],
            Taste::Form(Form::Brief) => &[
                "No, please answer in one short sentence.",
                "Could you say that in one short sentence instead?",
                "That's not what I asked for. Please keep it to one short sentence.",
            ],
            Taste::Form(Form::List) => &[
                "No, please answer with a bulleted list.",
                "Could you give me that as a bulleted list instead?",
                "That's not what I asked for. Please write it as a list of points.",
            ],
            Taste::RightAnswers => &["That's wrong. Please check your arithmetic."],
        }
    }

    /// What a user says to a reply that gives their question back instead of answering it,
    /// whatever its form: a correction (`user-feedback`: −1) whose request `correction-hint`
    /// turns into the hint "Answer it in one short sentence." (or as the user wants it).
    pub fn unanswered(self) -> &'static str {
        match self {
            Taste::Form(Form::Brief) => {
                "That's not an answer to my question. Please answer it in one short sentence."
            }
            Taste::Form(Form::List) => {
                "That's not an answer to my question. Please answer it with a bulleted list."
            }
            Taste::Case(_) | Taste::RightAnswers => {
                "That's not an answer to my question. Please answer it."
            }
        }
    }

    /// The hint `correction-hint` makes of the first correction: what the teacher of hint
    /// distillation has appended to the question, and what the probes of "the base model with
    /// the hint" append.
    pub fn hint(self) -> &'static str {
        match self {
            Taste::Case(Case::Upper) => "Answer in capital letters.",
            Taste::Case(Case::Lower) => "Answer in lowercase.",
            Taste::Case(Case::Title) => "Answer in title case.",
            Taste::Form(Form::Brief) => "Answer in one short sentence.",
            Taste::Form(Form::List) => "Answer with a bulleted list.",
            Taste::RightAnswers => "Check your arithmetic.",
        }
    }
}

impl std::fmt::Display for Taste {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
