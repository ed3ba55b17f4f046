//! A stream as the agent reads it, however vLLM cut it into chunks. vLLM sends every token it
//! decoded since its last event in one event: on a quiet host one token an event, on a loaded
//! one several — the same greedy answer came as the deltas `"��r"`, `"\t"` one time and `"��r\t"`
//! the next, five times in a row beside a busy CPU in a CI run (2026-12-07). Merging each run of
//! adjacent events of one kind (their text and logprob pieces joined, the last one's finish
//! reason kept) gives one form for both cuts; an event the sidecar changed, dropped or reordered
//! still differs.

use serde_json::{Map, Value};

/// Keys whose values a stream sends piecewise: text, arguments, and the logprobs that go with
/// them. A string or array under one of them is a piece; an object is looked into.
const PIECES: &[&str] = &[
    "delta",
    "content",
    "text",
    "arguments",
    "reasoning",
    "reasoning_content",
    "logprobs",
    "tokens",
    "token_logprobs",
    "top_logprobs",
    "text_offset",
];

/// Keys the last event of a run decides: why it ended, its place in the stream, and what vLLM
/// adds to a stream's last chunk only (`system_fingerprint`).
const LAST: &[&str] = &[
    "finish_reason",
    "stop_reason",
    "sequence_number",
    "system_fingerprint",
];

/// Keys two answers to one request differ in whatever the cut: their ids and creation times,
/// and each event's place in the stream (merged runs count differently).
const FORGOTTEN: &[&str] = &["id", "item_id", "created", "created_at", "sequence_number"];

/// One server-sent event: its `event:` name, if any, and its `data:` (JSON, or `[DONE]` as a
/// string).
#[derive(Debug, PartialEq)]
pub struct Event {
    name: Option<String>,
    data: Value,
}

impl Event {
    fn parse(text: &str) -> Event {
        let mut name = None;
        let mut data = String::new();
        for line in text.lines() {
            if let Some(value) = line.strip_prefix("event:") {
                name = Some(value.trim().to_owned());
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push_str(value.trim_start());
            }
        }
        let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
        Event { name, data }
    }
}

/// `events` (each an event's text) with every run of adjacent events of one kind merged, and
/// their ids, creation times and places forgotten.
pub fn merged(events: &[String]) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    for event in events.iter().map(|e| Event::parse(e)) {
        match out.last_mut() {
            Some(last) if last.name == event.name && shape(&last.data) == shape(&event.data) => {
                join(&mut last.data, &event.data);
            }
            _ => out.push(event),
        }
    }
    for event in &mut out {
        forget(&mut event.data);
    }
    out
}

/// `value` with its pieces and what the last event decides taken out: two events of one kind
/// have the same shape. A piece is left out, not emptied: vLLM sends a token that completes no
/// character yet as a chunk with logprobs and an empty `delta` (`{}`), and the same token cut
/// together with the next as one chunk with `content`.
fn shape(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, value)| {
                    let piece = PIECES.contains(&key.as_str())
                        && matches!(value, Value::String(_) | Value::Array(_));
                    !piece && !LAST.contains(&key.as_str())
                })
                .map(|(key, value)| (key.clone(), shape(value)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        other => other.clone(),
    }
}

/// Appends `next`'s pieces to `into`'s (both of one shape); what the last event decides is
/// `next`'s.
fn join(into: &mut Value, next: &Value) {
    match (into, next) {
        (Value::Object(into), Value::Object(next)) => {
            for (key, value) in next {
                let piece = PIECES.contains(&key.as_str());
                match into.get_mut(key) {
                    Some(Value::String(text)) if piece => {
                        text.push_str(value.as_str().unwrap_or_default());
                    }
                    Some(Value::Array(items)) if piece => {
                        items.extend(value.as_array().into_iter().flatten().cloned());
                    }
                    Some(existing) if !LAST.contains(&key.as_str()) => join(existing, value),
                    _ => {
                        into.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(into), Value::Array(next)) => {
            for (into, next) in into.iter_mut().zip(next) {
                join(into, next);
            }
        }
        _ => {}
    }
}

/// Drops what two answers to one request differ in whatever the cut ([`FORGOTTEN`]).
fn forget(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|key, _| !FORGOTTEN.contains(&key.as_str()));
            map.values_mut().for_each(forget);
        }
        Value::Array(items) => items.iter_mut().for_each(forget),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str, sequence: u64) -> String {
        format!(
            "event: response.output_text.delta\ndata: {{\"delta\":{},\"logprobs\":[],\
             \"sequence_number\":{sequence},\"type\":\"response.output_text.delta\"}}",
            serde_json::to_string(text).unwrap()
        )
    }

    #[test]
    fn two_cuts_of_one_answer_merge_alike() {
        let done = "event: response.output_text.done\ndata: {\"text\":\"ab\\t\"}".to_owned();
        let fine = [delta("a", 4), delta("b", 5), delta("\t", 6), done.clone()];
        let coarse = [delta("a", 4), delta("b\t", 5), done];
        assert_eq!(merged(&fine), merged(&coarse));
    }

    /// Two cuts of one streamed answer with logprobs, as vLLM sent them directly and through the
    /// sidecar in a CI run (2026-12-08): a token that completes no character is a chunk of its
    /// own (`delta: {}`) or rides with the next, and the last chunk alone has
    /// `system_fingerprint`.
    #[test]
    fn a_token_without_text_and_the_last_chunk_merge_however_cut() {
        let chunk = |delta: &str, tokens: &[&str], last: bool| {
            let logprobs: Vec<String> = tokens
                .iter()
                .map(|t| format!("{{\"token\":\"{t}\",\"logprob\":-1.0}}"))
                .collect();
            let end = if last {
                "\"finish_reason\":\"length\",\"stop_reason\":null}],\"system_fingerprint\":\"v\"}"
            } else {
                "\"finish_reason\":null}]}"
            };
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{delta},\
                 \"logprobs\":{{\"content\":[{}]}},{end}",
                logprobs.join(",")
            )
        };
        let direct = [
            chunk("{}", &[""], false),
            chunk("{\"content\":\"d\"}", &["d"], false),
            chunk("{\"content\":\"8/\"}", &["8", "/"], false),
            chunk("{\"content\":\"^\"}", &["^"], true),
        ];
        let through = [
            chunk("{\"content\":\"d\"}", &["", "d"], false),
            chunk("{\"content\":\"8/^\"}", &["8", "/", "^"], true),
        ];
        assert_eq!(merged(&direct), merged(&through));
        // A token the sidecar dropped still differs.
        let dropped = [
            chunk("{\"content\":\"d\"}", &["d"], false),
            chunk("{\"content\":\"8/^\"}", &["8", "/", "^"], true),
        ];
        assert_ne!(merged(&direct), merged(&dropped));
    }

    #[test]
    fn a_chunk_the_sidecar_changed_or_dropped_still_differs() {
        let chunk = |content: &str, finish: &str| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\
                 \"finish_reason\":{finish}}}]}}"
            )
        };
        let sent = [chunk("He", "null"), chunk("llo", "\"length\"")];
        assert_eq!(merged(&sent), merged(&[chunk("Hello", "\"length\"")]));
        assert_ne!(merged(&sent), merged(&[chunk("Hello", "null")]));
        assert_ne!(merged(&sent), merged(&[chunk("He", "\"length\"")]));
        let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\
                    \"content\":\"\"},\"finish_reason\":null}]}"
            .to_owned();
        assert_ne!(
            merged(&[role.clone(), sent[0].clone(), sent[1].clone()]),
            merged(&[sent[0].clone(), role, sent[1].clone()])
        );
    }
}
