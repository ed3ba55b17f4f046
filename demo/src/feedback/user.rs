//! The feedback loop's simulated user: one person holding a session with the assistant, who
//! wants every answer one way (a letter case, one short sentence, a list) and says so the way
//! people do. When a reply misses their taste, their next message is a correction that says
//! what to do differently ("No, please answer in capital letters."); when it fits, a thank-you
//! or simply the next question. A reply that gives the question back instead of answering it
//! is corrected whatever its form ("That's not an answer to my question. …"), as a person
//! would; whether it did is the caller's to tell (the gate's `restates_question` check).
//! The calls are plain chat completions with the whole conversation, as any OpenAI client makes
//! them: no session id, no handshake — the sidecar stitches them into one trajectory, and the
//! session ends when the user goes quiet (the sidecar's idle timeout).

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{json, Value};

use crate::chat::Talk;
use crate::taste::Taste;

/// What opens the next question when the reply fitted: thanks and moving on (+1 from
/// `user-feedback`), or nothing at all (no opinion).
const PRAISE: &[&str] = &["Thanks! ", "Perfect. ", "Great. ", ""];

/// One user's conversation so far.
pub struct Session {
    wants: Taste,
    questions: &'static [&'static str],
    next_question: usize,
    messages: Vec<Value>,
}

impl Session {
    /// A new session that opens as `talk` does with `questions[first]`, and goes on through
    /// the list.
    pub fn new(
        wants: Taste,
        talk: &Talk,
        questions: &'static [&'static str],
        first: usize,
    ) -> Self {
        let mut session = Session {
            wants,
            questions,
            next_question: first,
            messages: Vec::new(),
        };
        let question = session.question();
        session.messages = talk.opening(&question);
        session
    }

    /// The conversation to send.
    pub fn messages(&self) -> &[Value] {
        &self.messages
    }

    /// The question the user is waiting on an answer to.
    pub fn question_asked(&self) -> &'static str {
        let asked = self.next_question.saturating_sub(1);
        self.questions[asked % self.questions.len()]
    }

    /// Takes the assistant's reply and answers it: a correction when it missed (or, `restated`,
    /// gave the question back), else praise and the next question. Whether the reply fitted.
    pub fn reply(&mut self, reply: &str, restated: bool, rng: &mut StdRng) -> bool {
        self.messages
            .push(json!({"role": "assistant", "content": reply}));
        let fitted = self.wants.fits(reply) && !restated;
        let message = if restated {
            self.wants.unanswered().to_owned()
        } else if fitted {
            let praise = PRAISE.choose(rng).copied().unwrap_or_default();
            format!("{praise}{}", self.question())
        } else {
            let correction = self.wants.corrections().choose(rng).copied();
            correction.unwrap_or_default().to_owned()
        };
        self.say(message);
        fitted
    }

    fn question(&mut self) -> String {
        let question = self.questions[self.next_question % self.questions.len()];
        self.next_question += 1;
        question.to_owned()
    }

    fn say(&mut self, text: impl Into<String>) {
        self.messages
            .push(json!({"role": "user", "content": text.into()}));
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::form::Form;
    use crate::style::Case;

    #[test]
    fn a_missed_reply_is_corrected_and_a_fitting_one_moves_on() {
        let mut rng = StdRng::seed_from_u64(1);
        let upper = Taste::Case(Case::Upper);
        let talk = Talk {
            system: Some("Be brief."),
            sampling: crate::chat::Sampling::TINY,
        };
        let mut session = Session::new(upper, &talk, &["Name a city.", "Say hello."], 0);
        assert!(!session.reply("new york city", false, &mut rng));
        let correction = session.messages().last().unwrap()["content"].clone();
        assert!(upper.corrections().contains(&correction.as_str().unwrap()));
        assert!(session.reply("NEW YORK CITY", false, &mut rng));
        let next = session.messages().last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(next.ends_with("Say hello."), "{next}");
        assert_eq!(session.messages().len(), 6);
    }

    #[test]
    fn a_session_without_a_system_message_opens_with_the_question() {
        let mut rng = StdRng::seed_from_u64(1);
        let brief = Taste::Form(Form::Brief);
        let talk = Talk {
            system: None,
            sampling: crate::chat::Sampling::TINY,
        };
        let mut session = Session::new(brief, &talk, &["Why is the sky blue?"], 0);
        assert_eq!(session.messages()[0]["role"], "user");
        let long = "Sunlight scatters off the air. Blue light scatters most. So the sky is blue.";
        assert!(!session.reply(long, false, &mut rng));
        assert!(session.reply("Air scatters blue sunlight the most.", false, &mut rng));
    }

    #[test]
    fn a_reply_that_gives_the_question_back_is_no_answer_whatever_its_form() {
        let mut rng = StdRng::seed_from_u64(1);
        let brief = Taste::Form(Form::Brief);
        let talk = Talk {
            system: None,
            sampling: crate::chat::Sampling::TINY,
        };
        let mut session = Session::new(brief, &talk, &["Why is the sky blue?", "Name a city."], 0);
        assert_eq!(session.question_asked(), "Why is the sky blue?");
        assert!(!session.reply("Why is the sky blue?", true, &mut rng));
        let said = session.messages().last().unwrap()["content"].clone();
        assert_eq!(said.as_str(), Some(brief.unanswered()));
        // The user still waits on the same question.
        assert_eq!(session.question_asked(), "Why is the sky blue?");
        assert!(session.reply("Air scatters blue sunlight the most.", false, &mut rng));
        assert_eq!(session.question_asked(), "Name a city.");
    }
}
