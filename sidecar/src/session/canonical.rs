//! The canonical form of a conversation history, hashed turn by turn: what two serialisations of
//! the same history have in common once a client has re-encoded it. Session stitching compares
//! these hashes instead of the messages, so it keeps no message text.
//!
//! A history is a list of chat messages or of Responses-API `input` items; both reduce to the same
//! canonical turns, so the same conversation hashes alike in either shape:
//!
//! - **Assistant turn**: a maximal run of assistant-side items (a chat `assistant` message; a
//!   Responses `message` with role `assistant`, `function_call`, `reasoning`), reduced to its text
//!   and tool calls. Reasoning never counts: clients drop or keep it at will, and the recorder's
//!   reply must hash the same either way. `refusal`, `audio`, `name` and other extras do not count.
//! - **Tool result**: a chat `tool` message or a `function_call_output`: the tool-call id and the text.
//! - **Other message** (`system`, `developer`, `user`, ...): role, text and a non-empty `name`.
//! - **Anything else** (an item type we do not know): its canonical JSON, whole.
//!
//! Within a turn: text is the concatenation of the string content or of the text parts
//! (`text`, `input_text`, `output_text`), trimmed of ASCII whitespace; `null`, absent and `""` are the
//! same; a non-text part (image, audio, file) counts as its canonical JSON. A tool-call id keeps only
//! its ASCII alphanumerics (`call_abc-123` = `callabc123`). Tool-call `arguments` count as
//! canonical JSON (sorted keys, no whitespace, escapes decoded, integral floats as integers, `""` =
//! `{}`), or as the trimmed string when they are not JSON.
//!
//! Every field is written tagged and length-prefixed, so distinct canonical histories never
//! produce the same byte stream; the stream starts with the tenant, so every hash is per tenant.

use std::io::Write as _;

use clawback_datapool::TenantId;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::Xxh3Default;

/// Bumped whenever the canonical form changes, so old and new hashes never meet.
const DOMAIN: &[u8] = b"clawback-stitch-v1";

// Field tags. Values below 0x20 never appear unescaped in canonical JSON or in a length.
const ROLE: u8 = 0x01;
const TEXT: u8 = 0x02;
const PART: u8 = 0x03;
const NAME: u8 = 0x04;
const CALL: u8 = 0x05;
const CALL_ID: u8 = 0x06;
const ARGS_JSON: u8 = 0x07;
const ARGS_RAW: u8 = 0x08;
const OPAQUE: u8 = 0x09;

/// Where a canonical prefix of a history ends, in items of the history as sent, and its hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Boundary {
    /// The prefix is `history[..end]`.
    pub end: usize,
    /// The 128-bit hash of the tenant and the canonical turns of that prefix.
    pub hash: u128,
}

/// Hashes a history pushed item by item, recording a [`Boundary`] after every complete turn: one
/// pass over the history yields the hash of every prefix a stitching key could cover.
///
/// xxh3-128 because stitching hashes every request on the request path (a 40 kB history in a few
/// microseconds) and the hashes are never exposed: a tenant can at worst engineer a collision
/// between its own histories, and 128 bits keep accidental collisions out of reach (~2^-64 at
/// billions of live keys). A cryptographic hash would cost several times more for no gain here.
#[derive(Clone)]
pub struct HistoryHasher {
    hasher: Xxh3Default,
    /// Items pushed so far.
    pushed: usize,
    /// An assistant turn is open: assistant-side items keep adding to it until another item comes.
    assistant_open: bool,
    /// The canonical bytes of the turn being built.
    turn: Vec<u8>,
    /// Text not yet written to `turn`: consecutive text parts form one text.
    text: Vec<u8>,
    /// Scratch space for canonical JSON.
    json: Vec<u8>,
    boundaries: Vec<Boundary>,
}

impl HistoryHasher {
    pub fn new(tenant: &TenantId) -> Self {
        let mut hasher = Xxh3Default::new();
        let mut head = Vec::with_capacity(DOMAIN.len() + 80);
        put_bytes(&mut head, DOMAIN);
        put_bytes(&mut head, tenant.as_str().as_bytes());
        hasher.update(&head);
        HistoryHasher {
            hasher,
            pushed: 0,
            assistant_open: false,
            turn: Vec::with_capacity(1024),
            text: Vec::with_capacity(1024),
            json: Vec::with_capacity(256),
            boundaries: Vec::new(),
        }
    }

    /// Adds one message (chat) or input item (Responses) of a request.
    pub fn push(&mut self, item: &Value) {
        self.push_classified(classify(item));
    }

    /// Adds the assistant's reply to a call: a chat assistant message (with or without `role`, as
    /// the recorder stores it) or an array of Responses `output` items.
    pub fn push_reply(&mut self, reply: &Value) {
        match reply {
            Value::Array(items) => items.iter().for_each(|item| self.push(item)),
            Value::Object(message) if !message.contains_key("type") => {
                self.push_classified(Item::Assistant {
                    content: message.get("content"),
                    calls: chat_calls(message),
                });
            }
            other => self.push(other),
        }
    }

    /// Closes the last turn and returns the boundary after every turn, shortest prefix first.
    pub fn finish(mut self) -> Vec<Boundary> {
        if self.assistant_open {
            self.close_turn(self.pushed);
        }
        self.boundaries
    }

    fn push_classified(&mut self, item: Item<'_>) {
        if let Item::Assistant { content, calls } = item {
            if !self.assistant_open {
                self.assistant_open = true;
                put_tagged(&mut self.turn, ROLE, b"assistant");
            }
            self.content(content);
            self.calls(calls);
            self.pushed += 1;
            return;
        }
        if self.assistant_open {
            self.close_turn(self.pushed);
        }
        match item {
            Item::Assistant { .. } => {}
            Item::Message {
                role,
                content,
                name,
            } => {
                put_tagged(&mut self.turn, ROLE, role.as_bytes());
                if let Some(name) = name.filter(|n| !n.is_empty()) {
                    put_tagged(&mut self.turn, NAME, name.as_bytes());
                }
                self.content(content);
            }
            Item::ToolResult { call_id, content } => {
                put_tagged(&mut self.turn, ROLE, b"tool");
                put_call_id(&mut self.turn, call_id);
                self.content(content);
            }
            Item::Opaque(value) => {
                self.json.clear();
                write_canonical_json(value, &mut self.json);
                put_tagged(&mut self.turn, OPAQUE, &self.json);
            }
        }
        self.pushed += 1;
        self.close_turn(self.pushed);
    }

    fn close_turn(&mut self, end: usize) {
        self.flush_text();
        put_bytes_to_hasher(&mut self.hasher, &self.turn);
        self.turn.clear();
        self.assistant_open = false;
        self.boundaries.push(Boundary {
            end,
            hash: self.hasher.digest128(),
        });
    }

    fn content(&mut self, content: Option<&Value>) {
        match content {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => self.text.extend_from_slice(text.as_bytes()),
            Some(Value::Array(parts)) => parts.iter().for_each(|part| self.part(part)),
            Some(other) => self.opaque_part(other),
        }
    }

    fn part(&mut self, part: &Value) {
        match part {
            Value::String(text) => self.text.extend_from_slice(text.as_bytes()),
            Value::Object(fields) if is_text_part(fields) => {
                if let Some(text) = fields.get("text").and_then(Value::as_str) {
                    self.text.extend_from_slice(text.as_bytes());
                }
            }
            other => self.opaque_part(other),
        }
    }

    fn opaque_part(&mut self, part: &Value) {
        self.flush_text();
        self.json.clear();
        write_canonical_json(part, &mut self.json);
        put_tagged(&mut self.turn, PART, &self.json);
    }

    fn flush_text(&mut self) {
        let text = self.text.trim_ascii();
        if !text.is_empty() {
            put_tagged(&mut self.turn, TEXT, text);
        }
        self.text.clear();
    }

    fn calls(&mut self, calls: Calls<'_>) {
        match calls {
            Calls::None => {}
            Calls::Chat(calls) => {
                for call in calls {
                    let function = call.get("function");
                    self.call(
                        call.get("id").and_then(Value::as_str),
                        function.and_then(|f| f.get("name")).and_then(Value::as_str),
                        function.and_then(|f| f.get("arguments")),
                    );
                }
            }
            Calls::Responses(item) => self.call(
                item.get("call_id").and_then(Value::as_str),
                item.get("name").and_then(Value::as_str),
                item.get("arguments"),
            ),
        }
    }

    fn call(&mut self, id: Option<&str>, name: Option<&str>, arguments: Option<&Value>) {
        self.flush_text();
        self.turn.push(CALL);
        put_call_id(&mut self.turn, id);
        put_bytes(&mut self.turn, name.unwrap_or("").trim().as_bytes());
        self.json.clear();
        let parsed;
        let arguments = match arguments {
            Some(Value::String(raw)) if raw.trim().is_empty() => None,
            Some(Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
                Ok(value) => {
                    parsed = value;
                    Some(&parsed)
                }
                Err(_) => {
                    put_tagged(&mut self.turn, ARGS_RAW, raw.trim().as_bytes());
                    return;
                }
            },
            Some(Value::Null) | None => None,
            Some(value) => Some(value),
        };
        match arguments {
            Some(value) => write_canonical_json(value, &mut self.json),
            // No arguments and empty arguments mean a call without parameters.
            None => self.json.extend_from_slice(b"{}"),
        }
        put_tagged(&mut self.turn, ARGS_JSON, &self.json);
    }
}

/// True when `messages` ends with a context message that a client appends after the latest turn
/// and rebuilds on every call: a `system`, `developer` or `user` message that directly follows a
/// `user` message or a tool result. A plain chat turn never ends like that — its last user message
/// follows an assistant reply — and neither does a first call (`[system, user]`), which keeps a
/// history that merely starts like an earlier reply from matching it.
pub fn ends_with_context(messages: &[Value]) -> bool {
    let [.., before, last] = messages else {
        return false;
    };
    let is_context = matches!(
        classify(last),
        Item::Message {
            role: "system" | "developer" | "user",
            ..
        }
    );
    let ends_input = matches!(
        classify(before),
        Item::Message { role: "user", .. } | Item::ToolResult { .. }
    );
    is_context && ends_input
}

/// One history item, by what it contributes to the canonical form.
enum Item<'a> {
    /// An assistant message, or one piece of an assistant turn in Responses form.
    Assistant {
        content: Option<&'a Value>,
        calls: Calls<'a>,
    },
    ToolResult {
        call_id: Option<&'a str>,
        content: Option<&'a Value>,
    },
    Message {
        role: &'a str,
        content: Option<&'a Value>,
        name: Option<&'a str>,
    },
    Opaque(&'a Value),
}

enum Calls<'a> {
    None,
    /// A chat message's `tool_calls`.
    Chat(&'a [Value]),
    /// A Responses `function_call` item.
    Responses(&'a Map<String, Value>),
}

fn classify(item: &Value) -> Item<'_> {
    let fields = match item {
        Value::Object(fields) => fields,
        // Responses accepts a bare string as the user's input.
        Value::String(_) => {
            return Item::Message {
                role: "user",
                content: Some(item),
                name: None,
            }
        }
        other => return Item::Opaque(other),
    };
    match fields.get("type").and_then(Value::as_str) {
        None | Some("message") => match fields.get("role").and_then(Value::as_str) {
            Some("assistant") => Item::Assistant {
                content: fields.get("content"),
                calls: chat_calls(fields),
            },
            Some("tool") => Item::ToolResult {
                call_id: fields.get("tool_call_id").and_then(Value::as_str),
                content: fields.get("content"),
            },
            Some(role) => Item::Message {
                role,
                content: fields.get("content"),
                name: fields.get("name").and_then(Value::as_str),
            },
            None => Item::Opaque(item),
        },
        Some("function_call") => Item::Assistant {
            content: None,
            calls: Calls::Responses(fields),
        },
        Some("reasoning") => Item::Assistant {
            content: None,
            calls: Calls::None,
        },
        Some("function_call_output") => Item::ToolResult {
            call_id: fields.get("call_id").and_then(Value::as_str),
            content: fields.get("output"),
        },
        Some(_) => Item::Opaque(item),
    }
}

fn chat_calls(message: &Map<String, Value>) -> Calls<'_> {
    match message.get("tool_calls").and_then(Value::as_array) {
        Some(calls) => Calls::Chat(calls),
        None => Calls::None,
    }
}

fn is_text_part(part: &Map<String, Value>) -> bool {
    matches!(
        part.get("type").and_then(Value::as_str),
        Some("text" | "input_text" | "output_text")
    )
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn put_tagged(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_bytes(out, bytes);
}

fn put_bytes_to_hasher(hasher: &mut Xxh3Default, bytes: &[u8]) {
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// A tool-call id keeps only its ASCII alphanumerics: clients and engines re-issue ids with
/// separators stripped or changed (`call_abc-123` → `callabc123`).
fn put_call_id(out: &mut Vec<u8>, id: Option<&str>) {
    let id = id.unwrap_or("").as_bytes();
    out.push(CALL_ID);
    put_len(out, id.iter().filter(|b| b.is_ascii_alphanumeric()).count());
    out.extend(id.iter().filter(|b| b.is_ascii_alphanumeric()));
}

/// Largest magnitude below which every integer is exact in an f64 (2^53).
const EXACT_F64_INT: f64 = 9_007_199_254_740_992.0;

/// Writes `value` as canonical JSON: object keys sorted, no whitespace, strings escaped the one
/// way serde_json escapes them, and a float with an integral value as the integer (JavaScript
/// clients re-encode `1.0` as `1`).
pub fn write_canonical_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => {
            // Writing into a Vec cannot fail.
            let _ = match number.as_f64() {
                Some(f) if number.is_f64() && f.fract() == 0.0 && f.abs() < EXACT_F64_INT => {
                    write!(out, "{}", f as i64)
                }
                _ => write!(out, "{number}"),
            };
        }
        Value::String(s) => {
            // Writing into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, s);
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical_json(item, out);
            }
            out.push(b']');
        }
        Value::Object(fields) => {
            let mut entries: Vec<_> = fields.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Writing into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, key);
                out.push(b':');
                write_canonical_json(item, out);
            }
            out.push(b'}');
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn canonical(value: &Value) -> String {
        let mut out = Vec::new();
        write_canonical_json(value, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn hashes(history: &[Value]) -> Vec<Boundary> {
        let mut hasher = HistoryHasher::new(&TenantId::new("t").unwrap());
        history.iter().for_each(|item| hasher.push(item));
        hasher.finish()
    }

    #[test]
    fn canonical_json_sorts_keys_decodes_escapes_and_drops_whitespace() {
        let a: Value =
            serde_json::from_str(r#"{ "b": [1, 2.0, {"y": 1, "x": "\u00e9"}], "a": null }"#)
                .unwrap();
        assert_eq!(canonical(&a), r#"{"a":null,"b":[1,2,{"x":"é","y":1}]}"#);
        let b: Value = serde_json::from_str(r#"{"a":null,"b":[1,2,{"x":"é","y":1}]}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(canonical(&json!(1.5)), "1.5");
    }

    #[test]
    fn a_responses_turn_split_into_items_hashes_like_one_chat_message() {
        let chat = [
            json!({"role": "user", "content": "list files"}),
            json!({"role": "assistant", "content": "Listing.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}),
        ];
        let responses = [
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}),
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "ls", "arguments": ""}),
            json!({"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}),
        ];
        let chat = hashes(&chat);
        let responses = hashes(&responses);
        assert_eq!(
            chat.iter().map(|b| b.hash).collect::<Vec<_>>(),
            responses.iter().map(|b| b.hash).collect::<Vec<_>>()
        );
        assert_eq!(chat.iter().map(|b| b.end).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            responses.iter().map(|b| b.end).collect::<Vec<_>>(),
            [1, 4, 5]
        );
    }

    #[test]
    fn text_split_across_parts_or_moved_between_fields_does_not_collide() {
        let one = hashes(&[json!({"role": "user", "content": "ab"})]);
        let parts = hashes(&[json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
        ]})]);
        assert_eq!(one, parts);
        let named = hashes(&[json!({"role": "user", "content": "b", "name": "a"})]);
        assert_ne!(one[0].hash, named[0].hash);
    }

    #[test]
    fn a_trailing_context_message_is_one_that_follows_a_user_message_or_tool_result() {
        let user = json!({"role": "user", "content": "hi"});
        let system = json!({"role": "system", "content": "rules"});
        let tool = json!({"role": "tool", "tool_call_id": "c", "content": "ok"});
        let assistant = json!({"role": "assistant", "content": "hello"});
        let reminder = json!({"role": "user", "content": "<reminder/>"});
        assert!(ends_with_context(&[user.clone(), reminder.clone()]));
        assert!(ends_with_context(&[tool, reminder.clone()]));
        assert!(!ends_with_context(&[system, user]));
        assert!(!ends_with_context(&[assistant, reminder.clone()]));
        assert!(!ends_with_context(&[reminder]));
    }
}
