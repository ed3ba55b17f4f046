//! The canonical form of a conversation history, hashed turn by turn: what two serialisations of
//! the same history have in common once a client has re-encoded it. Session stitching compares
//! these hashes instead of the messages, so it keeps no message text.
//!
//! A history is a list of chat messages or of Responses-API `input` items; both reduce to the same
//! canonical turns, so the same conversation hashes alike in either shape:
//!
//! - **Assistant turn**: a maximal run of assistant-side items (a chat `assistant` message; a
//!   Responses `message` with role `assistant`, `function_call`, `reasoning`), reduced to its text
//!   and tool calls. Reasoning never counts (`reasoning_content`, `reasoning` items, `thinking`
//!   parts): clients drop or keep it at will, and the recorder's reply must hash the same either way. `refusal`, `audio`, `name` and other extras do not count.
//! - **Tool result**: a chat `tool` message or a `function_call_output`: the tool-call id and the text.
//! - **Other message** (`system`, `developer`, `user`, ...): role, text and a non-empty `name`.
//! - **Anything else** (an item type we do not know): its canonical value, whole.
//!
//! Within a turn: text is the concatenation of the string content or of the text parts
//! (`text`, `input_text`, `output_text`), trimmed of ASCII whitespace; `null`, absent and `""` are the
//! same; a non-text part (image, audio, file) counts as its canonical value. A tool-call id keeps
//! only its ASCII alphanumerics (`call_abc-123` = `callabc123`). Tool-call `arguments` count as the
//! canonical value of the JSON they hold (keys sorted, whitespace and escapes gone, integral floats
//! as integers, `""` = `{}`), or as the trimmed string when they are not JSON.
//!
//! Every field is written tagged and length-prefixed, and every turn closes with a tag of its own,
//! so distinct canonical histories never produce the same byte stream; the stream starts with the
//! tenant, so every hash is per tenant.

use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;
use std::ops::Range;

use clawback_datapool::TenantId;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use xxhash_rust::xxh3::Xxh3Default;

/// Bumped whenever the canonical form changes, so old and new hashes never meet.
const DOMAIN: &[u8] = b"clawback-stitch-v1";

// Field tags. Every variable-length field after a tag is length-prefixed, so content can never
// pass for a tag.
const ROLE: u8 = 0x01;
const TEXT: u8 = 0x02;
const PART: u8 = 0x03;
const NAME: u8 = 0x04;
const CALL: u8 = 0x05;
const CALL_ID: u8 = 0x06;
const ARGS_JSON: u8 = 0x07;
const ARGS_RAW: u8 = 0x08;
const OPAQUE: u8 = 0x09;
const TURN_END: u8 = 0x0a;

/// Where a canonical prefix of a history ends, in items of the history as sent, and its hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Boundary {
    /// The prefix is `history[..end]`.
    pub end: usize,
    /// The 128-bit hash of the tenant and the canonical turns of that prefix.
    pub hash: u128,
}

/// Hashes a history pushed item by item, recording a [`Boundary`] after every assistant turn: one
/// pass over the history yields the hash of every prefix a stitching key could cover (a key always
/// ends with the reply).
///
/// xxh3-128 because stitching hashes every request on the request path (xxh3 runs at memory
/// speed: a few microseconds of a 40 kB lookup) and the hashes are never exposed: a tenant can at worst engineer a collision
/// between its own histories, and 128 bits keep accidental collisions out of reach (~2^-64 at
/// billions of live keys). A cryptographic hash would cost several times more for no gain here.
#[derive(Clone)]
pub struct HistoryHasher {
    hasher: Xxh3Default,
    /// Items pushed so far.
    pushed: usize,
    /// An assistant turn is open: assistant-side items keep adding to it until another item comes.
    assistant_open: bool,
    /// Small fields of the turn being built, staged to spare the hasher many tiny updates.
    turn: Vec<u8>,
    /// Text not yet hashed: consecutive text parts form one text.
    text: Vec<u8>,
    /// Scratch space for canonical values.
    json: Vec<u8>,
    boundaries: Vec<Boundary>,
    /// The hash of what came before the first assistant turn, once one came.
    opening: Option<u128>,
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
            opening: None,
        }
    }

    /// The hash of the history's opening: everything before its first assistant turn (the
    /// system prompt, the first request), all of it when there is none yet. Every call of a
    /// conversation shares it, its first call included.
    pub fn opening(&self) -> u128 {
        self.opening.unwrap_or_else(|| self.hasher.digest128())
    }

    /// Adds one message (chat) or input item (Responses) of a request.
    pub fn push(&mut self, item: &Value) {
        self.push_classified(classify(item));
    }

    /// Adds the assistant's reply to a call: a chat assistant message (with or without `role`, as
    /// the recorder stores it) or an array of Responses `output` items. Always ends with an open
    /// assistant turn.
    pub fn push_reply(&mut self, reply: &Value) {
        match reply {
            Value::Array(items) => items.iter().for_each(|item| self.push(item)),
            Value::Object(message) if !message.contains_key("type") => {
                let fields = Fields::of(message);
                self.push_classified(Item::Assistant {
                    content: fields.content,
                    calls: chat_calls(&fields),
                });
            }
            other => self.push(other),
        }
        if !self.assistant_open {
            // A reply with no assistant item still ends with an (empty) assistant turn: the key
            // must cover the reply, never stop at an earlier turn of the request.
            self.push_classified(Item::Assistant {
                content: None,
                calls: Calls::None,
            });
        }
    }

    /// Closes the last turn and returns the boundary after every assistant turn, shortest prefix
    /// first.
    pub fn finish(mut self) -> Vec<Boundary> {
        if self.assistant_open {
            self.close_turn(self.pushed);
        }
        self.boundaries
    }

    fn push_classified(&mut self, item: Item<'_>) {
        if let Item::Assistant { content, calls } = item {
            if !self.assistant_open {
                // Every turn before it is closed (and hashed) already.
                self.opening.get_or_insert_with(|| self.hasher.digest128());
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
                write_canonical_value(value, &mut self.json);
                put_payload(&mut self.hasher, &mut self.turn, OPAQUE, &self.json);
            }
        }
        self.pushed += 1;
        self.close_turn(self.pushed);
    }

    fn close_turn(&mut self, end: usize) {
        self.flush_text();
        self.turn.push(TURN_END);
        self.hasher.update(&self.turn);
        self.turn.clear();
        // Every stitching key ends with a reply, so only assistant turns can end a match.
        if std::mem::take(&mut self.assistant_open) {
            self.boundaries.push(Boundary {
                end,
                hash: self.hasher.digest128(),
            });
        }
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
        let text = match part {
            Value::String(text) => text.as_str(),
            Value::Object(fields) => match Fields::of(fields) {
                Fields {
                    kind: Some("text" | "input_text" | "output_text"),
                    text,
                    ..
                } => text.unwrap_or(""),
                // Reasoning a client keeps as a content part does not count, like
                // `reasoning_content`.
                Fields {
                    kind: Some("thinking" | "redacted_thinking" | "reasoning"),
                    ..
                } => return,
                _ => return self.opaque_part(part),
            },
            _ => return self.opaque_part(part),
        };
        self.text.extend_from_slice(text.as_bytes());
    }

    fn opaque_part(&mut self, part: &Value) {
        self.flush_text();
        self.json.clear();
        write_canonical_value(part, &mut self.json);
        put_payload(&mut self.hasher, &mut self.turn, PART, &self.json);
    }

    fn flush_text(&mut self) {
        let text = self.text.trim_ascii();
        if !text.is_empty() {
            put_payload(&mut self.hasher, &mut self.turn, TEXT, text);
        }
        self.text.clear();
    }

    fn calls(&mut self, calls: Calls<'_>) {
        match calls {
            Calls::None => {}
            Calls::Chat(calls) => {
                for call in calls {
                    let Value::Object(call) = call else {
                        self.call(None, None, None);
                        continue;
                    };
                    let call = Fields::of(call);
                    let function = match call.function {
                        Some(Value::Object(function)) => Fields::of(function),
                        _ => Fields::default(),
                    };
                    self.call(call.id, function.name, function.arguments);
                }
            }
            Calls::Responses(item) => self.call(item.call_id, item.name, item.arguments),
        }
    }

    fn call(&mut self, id: Option<&str>, name: Option<&str>, arguments: Option<&Value>) {
        self.flush_text();
        self.turn.push(CALL);
        put_call_id(&mut self.turn, id);
        put_bytes(&mut self.turn, name.unwrap_or("").trim().as_bytes());
        self.json.clear();
        match arguments {
            // No arguments and empty arguments mean a call without parameters.
            None | Some(Value::Null) => self.json.extend_from_slice(b"{}"),
            Some(Value::String(raw)) if raw.trim().is_empty() => self.json.extend_from_slice(b"{}"),
            Some(Value::String(raw)) => {
                if write_canonical_value_str(raw, &mut self.json).is_err() {
                    put_tagged(&mut self.turn, ARGS_RAW, raw.trim().as_bytes());
                    return;
                }
            }
            Some(value) => write_canonical_value(value, &mut self.json),
        }
        put_payload(&mut self.hasher, &mut self.turn, ARGS_JSON, &self.json);
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
    Responses(Fields<'a>),
}

fn classify(item: &Value) -> Item<'_> {
    let fields = match item {
        Value::Object(fields) => Fields::of(fields),
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
    match fields.kind {
        None | Some("message") => match fields.role {
            Some("assistant") => Item::Assistant {
                content: fields.content,
                calls: chat_calls(&fields),
            },
            Some("tool") => Item::ToolResult {
                call_id: fields.tool_call_id,
                content: fields.content,
            },
            Some(role) => Item::Message {
                role,
                content: fields.content,
                name: fields.name,
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
            call_id: fields.call_id,
            content: fields.output,
        },
        Some(_) => Item::Opaque(item),
    }
}

fn chat_calls<'a>(message: &Fields<'a>) -> Calls<'a> {
    match message.tool_calls {
        Some(Value::Array(calls)) => Calls::Chat(calls),
        _ => Calls::None,
    }
}

/// The fields of a message, item, part or tool call that the canonical form reads, found in one
/// pass: objects have a handful of fields, and a keyed lookup would hash the key every time.
#[derive(Clone, Copy, Default)]
struct Fields<'a> {
    kind: Option<&'a str>,
    role: Option<&'a str>,
    content: Option<&'a Value>,
    text: Option<&'a str>,
    name: Option<&'a str>,
    tool_calls: Option<&'a Value>,
    tool_call_id: Option<&'a str>,
    id: Option<&'a str>,
    call_id: Option<&'a str>,
    function: Option<&'a Value>,
    arguments: Option<&'a Value>,
    output: Option<&'a Value>,
}

impl<'a> Fields<'a> {
    fn of(object: &'a Map<String, Value>) -> Self {
        let mut fields = Fields::default();
        for (key, value) in object {
            match key.as_str() {
                "type" => fields.kind = value.as_str(),
                "role" => fields.role = value.as_str(),
                "content" => fields.content = Some(value),
                "text" => fields.text = value.as_str(),
                "name" => fields.name = value.as_str(),
                "tool_calls" => fields.tool_calls = Some(value),
                "tool_call_id" => fields.tool_call_id = value.as_str(),
                "id" => fields.id = value.as_str(),
                "call_id" => fields.call_id = value.as_str(),
                "function" => fields.function = Some(value),
                "arguments" => fields.arguments = Some(value),
                "output" => fields.output = Some(value),
                _ => {}
            }
        }
        fields
    }
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

/// Writes a large field (text, a canonical value) straight to the hasher, after what is staged.
fn put_payload(hasher: &mut Xxh3Default, staged: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    staged.push(tag);
    put_len(staged, bytes.len());
    hasher.update(staged);
    staged.clear();
    hasher.update(bytes);
}

/// A tool-call id keeps only its ASCII alphanumerics: clients and engines re-issue ids with
/// separators stripped or changed (`call_abc-123` → `callabc123`).
fn put_call_id(out: &mut Vec<u8>, id: Option<&str>) {
    out.push(CALL_ID);
    let len_at = out.len();
    put_len(out, 0);
    let start = out.len();
    // Ids are short but every call has several: 16-byte blocks without a separator (most of
    // them) are checked without a branch per byte and copied whole.
    let mut blocks = id.unwrap_or("").as_bytes().chunks_exact(16);
    for block in &mut blocks {
        if block
            .iter()
            .fold(true, |all, b| all & b.is_ascii_alphanumeric())
        {
            out.extend_from_slice(block);
        } else {
            put_alphanumerics(out, block);
        }
    }
    put_alphanumerics(out, blocks.remainder());
    let len = (out.len() - start) as u64;
    out[len_at..start].copy_from_slice(&len.to_le_bytes());
}

/// Appends the ASCII alphanumerics of a block of at most 16 bytes, compacted on the stack: pushing
/// byte by byte would store the Vec's length after every byte.
fn put_alphanumerics(out: &mut Vec<u8>, block: &[u8]) {
    let mut kept = [0u8; 16];
    let mut n = 0;
    for &byte in block.iter().take(16) {
        kept[n % 16] = byte;
        n += usize::from(byte.is_ascii_alphanumeric());
    }
    out.extend_from_slice(&kept[..n]);
}

/// Largest magnitude below which every integer is exact in an f64 (2^53).
const EXACT_F64_INT: f64 = 9_007_199_254_740_992.0;

/// Writes the canonical encoding of a JSON value: JSON-like, object keys sorted, no whitespace, a
/// float with an integral value as the integer (JavaScript clients re-encode `1.0` as `1`), and
/// strings as length-prefixed UTF-8 instead of escaped text — it is only ever hashed, and escaping
/// was the dearest part of it.
pub fn write_canonical_value(value: &Value, out: &mut Vec<u8>) {
    // A Value is always valid JSON, and writing into a Vec cannot fail.
    let _ = CanonicalJson(out).deserialize(value);
}

/// [`write_canonical_value`] straight from JSON text, without building a `Value` (its maps hash
/// every key): tool-call arguments are parsed on every stitching lookup. Fails when `raw` is not JSON; what
/// it wrote to `out` by then is garbage.
pub fn write_canonical_value_str(raw: &str, out: &mut Vec<u8>) -> serde_json::Result<()> {
    let mut json = serde_json::Deserializer::from_str(raw);
    CanonicalJson(out).deserialize(&mut json)?;
    json.end()
}

/// Writes what it deserializes in the canonical encoding.
struct CanonicalJson<'o>(&'o mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for CanonicalJson<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, json: D) -> Result<(), D::Error> {
        json.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CanonicalJson<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        // Writing into a Vec cannot fail.
        let _ = write!(self.0, "{v}");
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        let _ = write!(self.0, "{v}");
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        let _ = match serde_json::Number::from_f64(v) {
            Some(_) if v.fract() == 0.0 && v.abs() < EXACT_F64_INT => {
                write!(self.0, "{}", v as i64)
            }
            Some(number) => write!(self.0, "{number}"),
            // JSON text has no NaN or infinity.
            None => write!(self.0, "null"),
        };
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        put_tagged(self.0, b'"', v.as_bytes());
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            let mark = self.0.len();
            if !first {
                self.0.push(b',');
            }
            if items
                .next_element_seed(CanonicalJson(&mut *self.0))?
                .is_none()
            {
                self.0.truncate(mark);
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<(), A::Error> {
        // Values are written as they come, then the object is rebuilt in key order.
        let start = self.0.len();
        let mut entries: Vec<(Cow<'de, str>, Range<usize>)> = Vec::new();
        while let Some(key) = fields.next_key_seed(Key)? {
            let from = self.0.len() - start;
            fields.next_value_seed(CanonicalJson(&mut *self.0))?;
            entries.push((key, from..self.0.len() - start));
        }
        // Stable: duplicate keys keep their order.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let values = self.0.split_off(start);
        self.0.push(b'{');
        for (i, (key, value)) in entries.into_iter().enumerate() {
            if i > 0 {
                self.0.push(b',');
            }
            put_tagged(self.0, b'"', key.as_bytes());
            self.0.push(b':');
            self.0.extend_from_slice(&values[value]);
        }
        self.0.push(b'}');
        Ok(())
    }
}

/// An object key, borrowed from the JSON text when it has no escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, json: D) -> Result<Cow<'de, str>, D::Error> {
        json.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The canonical encoding of `value`, checked to be the same from the value and from its text.
    fn canonical(value: &Value) -> Vec<u8> {
        let mut from_value = Vec::new();
        write_canonical_value(value, &mut from_value);
        let mut from_text = Vec::new();
        write_canonical_value_str(&value.to_string(), &mut from_text).unwrap();
        assert_eq!(from_value, from_text);
        from_value
    }

    fn hashes(history: &[Value]) -> Vec<Boundary> {
        let mut hasher = HistoryHasher::new(&TenantId::new("t").unwrap());
        history.iter().for_each(|item| hasher.push(item));
        hasher.finish()
    }

    /// The hash of `message` followed by a reply (only a reply ends a prefix that is hashed).
    fn hash_before_reply(message: Value) -> u128 {
        let boundaries = hashes(&[message, json!({"role": "assistant", "content": "ok"})]);
        boundaries[0].hash
    }

    #[test]
    fn canonical_values_ignore_key_order_whitespace_escapes_and_integral_floats() {
        let a: Value =
            serde_json::from_str(r#"{ "b": [1, 2.0, {"y": 1, "x": "\u00e9"}], "a": null }"#)
                .unwrap();
        let b: Value = serde_json::from_str(r#"{"a":null,"b":[1,2,{"x":"é","y":1}]}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(
            canonical(&json!({"a": {}, "b": []})),
            b"{\"\x01\0\0\0\0\0\0\0a:{},\"\x01\0\0\0\0\0\0\0b:[]}"
        );
        for (x, y) in [
            (json!(1.5), json!(1)),
            (json!("1"), json!(1)),
            (json!({"a": "b"}), json!({"b": "a"})),
            (json!(["a,b"]), json!(["a", "b"])),
            (json!(18446744073709551615u64), json!(1e300)),
        ] {
            assert_ne!(canonical(&x), canonical(&y), "{x} vs {y}");
        }
        assert!(write_canonical_value_str("{\"a\": 1} trailing", &mut Vec::new()).is_err());
    }

    #[test]
    fn a_responses_turn_split_into_items_hashes_like_one_chat_message() {
        let chat = [
            json!({"role": "user", "content": "list files"}),
            json!({"role": "assistant", "content": "Listing.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}),
            json!({"role": "assistant", "content": "One file: a.txt."}),
        ];
        let responses = [
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}),
            json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "ls", "arguments": ""}),
            json!({"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}),
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "One file: a.txt."}]}),
        ];
        let chat = hashes(&chat);
        let responses = hashes(&responses);
        assert_eq!(
            chat.iter().map(|b| b.hash).collect::<Vec<_>>(),
            responses.iter().map(|b| b.hash).collect::<Vec<_>>()
        );
        assert_eq!(chat.iter().map(|b| b.end).collect::<Vec<_>>(), [2, 4]);
        assert_eq!(responses.iter().map(|b| b.end).collect::<Vec<_>>(), [4, 6]);
    }

    #[test]
    fn text_split_across_parts_or_moved_between_fields_does_not_collide() {
        let one = hash_before_reply(json!({"role": "user", "content": "ab"}));
        let parts = hash_before_reply(json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
        ]}));
        assert_eq!(one, parts);
        let named = hash_before_reply(json!({"role": "user", "content": "b", "name": "a"}));
        assert_ne!(one, named);
    }

    #[test]
    fn reasoning_kept_as_a_content_part_does_not_count() {
        let plain = hashes(&[json!({"role": "assistant", "content": "42"})]);
        let thinking = hashes(&[json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "6 times 7", "signature": "abc"},
            {"type": "text", "text": "42"}
        ]})]);
        assert_eq!(plain, thinking);
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
