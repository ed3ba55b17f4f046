//! `user-feedback`: scores a step by the user's next message. A correction, a repeated request
//! or a complaint → −1; thanks or moving on to the next task → +1; anything else → 0. A step
//! the user did not answer (tool results only) gets no opinion. The reading of the reply is the
//! SDK's [`reaction`](clawback_filter_sdk::reaction).

use clawback_filter_sdk::reaction::reaction;
use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

pub struct UserFeedback;

impl Filter for UserFeedback {
    const DESCRIPTION: &'static str =
        "the user's next message: corrections and complaints -1, thanks and moving on +1";

    fn evaluate_step(step: Step, next: NextState) -> Evaluation {
        let Some(reply) = next.user_message.as_deref() else {
            return Evaluation::none();
        };
        let reaction = reaction(step.last_user_message(), reply);
        Evaluation::reward(reaction.reward()).label("reaction", reaction.as_str())
    }
}

export_filter!(UserFeedback);
