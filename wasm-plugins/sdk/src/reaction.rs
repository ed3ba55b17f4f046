//! How a user's reply reacts to the step it follows — a correction, a repeated request, a
//! complaint, thanks, moving on — read from the reply's words alone. Shared by the plugins
//! that score or learn from the user's next message (`user-feedback`, `correction-hint`).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    Corrects,
    Repeats,
    Complains,
    Thanks,
    MovesOn,
    Neutral,
}

impl Reaction {
    /// The reply says the step missed: a correction, the request asked again, a complaint.
    pub fn is_negative(self) -> bool {
        matches!(
            self,
            Reaction::Corrects | Reaction::Repeats | Reaction::Complains
        )
    }

    /// −1 for a negative reaction, +1 for thanks or moving on, 0 for anything else.
    pub fn reward(self) -> f64 {
        match self {
            Reaction::Corrects | Reaction::Repeats | Reaction::Complains => -1.0,
            Reaction::Thanks | Reaction::MovesOn => 1.0,
            Reaction::Neutral => 0.0,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reaction::Corrects => "corrects",
            Reaction::Repeats => "repeats",
            Reaction::Complains => "complains",
            Reaction::Thanks => "thanks",
            Reaction::MovesOn => "moves_on",
            Reaction::Neutral => "neutral",
        }
    }
}

const CORRECTIONS: &[&str] = &[
    "no,",
    "no.",
    "nope",
    "that's wrong",
    "that is wrong",
    "that's not",
    "that is not",
    "not what i",
    "wrong",
    "incorrect",
    "you didn't",
    "you did not",
    "you forgot",
    "you missed",
    "i said",
    "i asked",
    "i meant",
    "actually,",
    "instead",
    "try again",
    "still not",
    "still doesn't",
    "still does not",
    "doesn't work",
    "does not work",
    "didn't work",
    "not working",
    "that broke",
    "you broke",
];

const COMPLAINTS: &[&str] = &[
    "useless",
    "frustrat",
    "annoying",
    "ridiculous",
    "terrible",
    "stop ",
    "why did you",
    "why would you",
    "come on",
    "ugh",
    "seriously",
    "waste of",
    "are you even",
];

const THANKS: &[&str] = &[
    "thank",
    "thx",
    "cheers",
    "perfect",
    "great job",
    "nice work",
    "well done",
    "awesome",
    "excellent",
    "that works",
    "it works",
    "works now",
    "exactly what",
    "looks good",
    "lgtm",
    "brilliant",
];

const MOVING_ON: &[&str] = &[
    "next,",
    "next:",
    "now ",
    "now,",
    "ok,",
    "ok ",
    "okay",
    "great,",
    "great.",
    "good,",
    "good.",
    "cool",
    "and then",
    "also,",
    "one more thing",
    "moving on",
    "let's move",
    "next task",
    "another question",
];

/// How `reply` reacts to the step that answered `request`.
pub fn reaction(request: Option<&str>, reply: &str) -> Reaction {
    let lower = reply.trim().to_lowercase();
    if request.is_some_and(|request| repeats(request, &lower)) {
        return Reaction::Repeats;
    }
    // A marker counts at the start, after a space, or anywhere when it is long enough not to
    // hide inside another word.
    let starts_or_contains = |markers: &[&str]| {
        markers.iter().any(|m| {
            lower.starts_with(m.trim_end())
                || lower.contains(&format!(" {m}"))
                || (m.len() > 6 && lower.contains(m))
        })
    };
    if starts_or_contains(COMPLAINTS) {
        return Reaction::Complains;
    }
    if starts_or_contains(CORRECTIONS) {
        return Reaction::Corrects;
    }
    if starts_or_contains(THANKS) {
        return Reaction::Thanks;
    }
    if MOVING_ON.iter().any(|m| lower.starts_with(m)) {
        return Reaction::MovesOn;
    }
    Reaction::Neutral
}

/// The reply asks the same thing again: most of its words were in the request.
fn repeats(request: &str, reply_lower: &str) -> bool {
    let request = words(&request.to_lowercase());
    let reply = words(reply_lower);
    if reply.len() < 3 || request.is_empty() {
        return false;
    }
    let shared = reply.iter().filter(|w| request.contains(w)).count();
    shared * 10 >= reply.len() * 8
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASKED: &str = "Can you rename the `fetch_user` function to `load_user` across the repo?";

    #[test]
    fn corrections_repeats_and_complaints_score_minus_one() {
        for reply in [
            "No, I meant only in the api/ folder, not the tests.",
            "That's not what I asked. Revert the test changes.",
            "You forgot the call in handlers.rs",
            "It still doesn't compile.",
        ] {
            assert_eq!(reaction(Some(ASKED), reply), Reaction::Corrects, "{reply}");
        }
        assert_eq!(
            reaction(
                Some(ASKED),
                "can you rename the fetch_user function to load_user across the repo"
            ),
            Reaction::Repeats
        );
        assert_eq!(
            reaction(Some(ASKED), "This is useless, you keep breaking the build."),
            Reaction::Complains
        );
    }

    #[test]
    fn thanks_and_moving_on_score_plus_one() {
        assert_eq!(
            reaction(Some(ASKED), "Thanks, that works!"),
            Reaction::Thanks
        );
        assert_eq!(reaction(Some(ASKED), "Perfect."), Reaction::Thanks);
        assert_eq!(
            reaction(Some(ASKED), "Ok, now add a changelog entry for it."),
            Reaction::MovesOn
        );
        assert_eq!(
            reaction(Some(ASKED), "Next: bump the version to 0.4.0"),
            Reaction::MovesOn
        );
    }

    #[test]
    fn anything_else_is_neutral() {
        assert_eq!(
            reaction(
                Some(ASKED),
                "What does load_user return when the id is missing?"
            ),
            Reaction::Neutral
        );
        assert_eq!(Reaction::Neutral.reward(), 0.0);
    }
}
