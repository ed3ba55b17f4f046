//! A step and its next state as plain text, for judge prompts.

use crate::{Message, NextState, Step};

/// The step's conversation (its last `context` messages), the model's reply, and what followed,
/// as a readable transcript.
pub fn transcript(step: &Step, next: &NextState, context: usize) -> String {
    let mut out = String::from("## Conversation so far\n");
    let skip = step.messages.len().saturating_sub(context);
    for message in &step.messages[skip..] {
        push_message(&mut out, message);
    }
    out.push_str("\n## The assistant's reply being judged\n");
    push_message(&mut out, &step.output);
    out.push_str("\n## What happened next\n");
    if next.messages.is_empty() {
        out.push_str("(nothing yet)\n");
    }
    for message in &next.messages {
        push_message(&mut out, message);
    }
    out
}

fn push_message(out: &mut String, message: &Message) {
    out.push_str(&format!("[{}]", message.role));
    if let Some(id) = &message.tool_call_id {
        out.push_str(&format!(" (result of {id})"));
    }
    out.push(' ');
    out.push_str(&message.content);
    for call in &message.tool_calls {
        out.push_str(&format!("\n  -> calls {}({})", call.name, call.arguments));
    }
    out.push('\n');
}
