//! [`super::strip`] for a non-streamed answer too large to hold: the same fields taken out as
//! the body streams past, frame by frame, in bounded memory.
//!
//! A whole body is stripped by one parse; one larger than the step cap is never whole in memory,
//! so this reads it a byte at a time, tracking only where it is (inside which object, array or
//! string) and holding back at most an object key and the separators before it until it knows
//! whether that member goes. No JSON crate streams without holding each whole token (a 9 MB
//! `content` string would be held whole), hence this small scanner. Every byte not taken out is
//! passed on as the engine wrote it; bytes that are not JSON pass as they came.

use super::request::{Injected, Unasked};

/// What a container is, for the fields that are taken out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The body's top-level object (`prompt_token_ids`).
    Top,
    /// The top-level `choices` array.
    Choices,
    /// One of its choices (`prompt_token_ids`, `token_ids`, `logprobs`).
    Choice,
    Other,
}

#[derive(Clone, Copy, Debug)]
struct Container {
    object: bool,
    role: Role,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A value may start here.
    Value,
    /// In an object: a key or its end may start here.
    Key,
    /// After a key: its colon.
    Colon,
    /// After a value: a comma or a container's end.
    After,
    /// Inside a string; `key` when it is an object's key.
    Str { key: bool, escape: bool },
    /// Inside a number or a literal.
    Scalar,
}

/// What becomes of the value of the member being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Member {
    Keep,
    /// Its value becomes `null`.
    Null,
    /// The whole member goes, key and all.
    Drop,
}

/// A key longer than this is none of the fields taken out: it is passed on as it comes.
const LONGEST_KEY: usize = 64;

#[derive(Debug)]
pub struct StreamStrip {
    injected: Injected,
    stack: Vec<Container>,
    state: State,
    /// Bytes of the member being read (its comma, white space and key so far) while it is not
    /// known whether it stays; `None` when nothing is held.
    held: Option<Vec<u8>>,
    /// The key being read, while it may be one taken out.
    key: Vec<u8>,
    member: Member,
    /// The key of the member whose value is read, when it matters (`choices`).
    last_key: Option<&'static str>,
    /// Skipping a value that started at this depth.
    skip: Option<usize>,
    /// The first member of an object was dropped: the comma after it goes too.
    drop_comma: bool,
}

impl StreamStrip {
    pub fn new(injected: Injected) -> Self {
        Self {
            injected,
            stack: Vec::new(),
            state: State::Value,
            held: None,
            key: Vec::new(),
            member: Member::Keep,
            last_key: None,
            skip: None,
            drop_comma: false,
        }
    }

    /// The bytes to send on for `chunk`.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len());
        for &b in chunk {
            self.byte(b, &mut out);
        }
        out
    }

    /// Whatever is still held at the end of the body (a body cut off inside a key).
    pub fn finish(&mut self) -> Vec<u8> {
        self.held.take().unwrap_or_default()
    }

    fn emit(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.skip.is_some() {
            return;
        }
        match &mut self.held {
            Some(held) => held.push(b),
            None => out.push(b),
        }
    }

    fn role(&self) -> Option<Role> {
        self.stack.last().map(|c| c.role)
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Str { key, escape } => {
                self.emit(b, out);
                if key && self.held.is_some() {
                    self.key.push(b);
                    if self.key.len() > LONGEST_KEY {
                        self.decide(Member::Keep, out);
                    }
                }
                let closes = b == b'"' && !escape;
                self.state = State::Str {
                    key,
                    escape: !escape && b == b'\\',
                };
                if closes {
                    if key {
                        self.key_read(out);
                        self.state = State::Colon;
                    } else {
                        self.state = State::After;
                        self.value_ended();
                    }
                }
            }
            State::Scalar => {
                if matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace() {
                    self.state = State::After;
                    self.value_ended();
                    self.byte(b, out);
                } else {
                    self.emit(b, out);
                }
            }
            _ if b.is_ascii_whitespace() => self.emit(b, out),
            State::Key => match b {
                b'"' => {
                    self.key.clear();
                    if self.held.is_none() && matches!(self.role(), Some(Role::Top | Role::Choice))
                    {
                        self.held = Some(Vec::new());
                    }
                    self.emit(b, out);
                    self.state = State::Str {
                        key: true,
                        escape: false,
                    };
                }
                _ => {
                    // `}` (an empty object, or a stray one) or bytes that are not JSON.
                    self.flush(out);
                    self.state = State::After;
                    self.byte(b, out);
                }
            },
            State::Colon => {
                self.state = State::Value;
                match b {
                    // Skipped with a dropped member.
                    b':' => self.emit(b, out),
                    _ => self.byte(b, out),
                }
            }
            State::Value => self.value_starts(b, out),
            State::After => match b {
                b',' => {
                    let in_object = self.stack.last().is_some_and(|c| c.object);
                    if !in_object {
                        self.state = State::Value;
                        self.emit(b, out);
                        return;
                    }
                    self.state = State::Key;
                    if matches!(self.role(), Some(Role::Top | Role::Choice)) {
                        self.held = Some(Vec::new());
                    }
                    // After a dropped first member its comma goes, and the next is first.
                    if !std::mem::take(&mut self.drop_comma) {
                        self.emit(b, out);
                    }
                }
                b'}' | b']' => {
                    // The end of the object a first member was dropped from (not of the
                    // dropped value itself).
                    if self.skip.is_none() {
                        self.drop_comma = false;
                    }
                    self.emit(b, out);
                    self.stack.pop();
                    self.state = State::After;
                    self.value_ended();
                }
                _ => self.emit(b, out),
            },
        }
    }

    /// A value begins with `b`, the member's decision applied to it.
    fn value_starts(&mut self, b: u8, out: &mut Vec<u8>) {
        if b == b']' {
            // An empty array's end.
            self.state = State::After;
            self.byte(b, out);
            return;
        }
        let member = std::mem::replace(&mut self.member, Member::Keep);
        if member != Member::Keep && self.skip.is_none() {
            if member == Member::Null {
                out.extend_from_slice(b"null");
            }
            self.skip = Some(self.stack.len());
        }
        self.emit(b, out);
        let role = match (self.role(), self.last_key.take(), b) {
            (None, _, b'{') => Role::Top,
            (Some(Role::Top), Some("choices"), b'[') => Role::Choices,
            (Some(Role::Choices), _, b'{') => Role::Choice,
            _ => Role::Other,
        };
        match b {
            b'{' => {
                self.stack.push(Container { object: true, role });
                self.state = State::Key;
            }
            b'[' => {
                self.stack.push(Container {
                    object: false,
                    role,
                });
                self.state = State::Value;
            }
            b'"' => {
                self.state = State::Str {
                    key: false,
                    escape: false,
                }
            }
            _ => self.state = State::Scalar,
        }
    }

    /// A value ended (the stack is back at the depth it started at): a skip of it ends.
    fn value_ended(&mut self) {
        if self.skip.is_some_and(|depth| self.stack.len() <= depth) {
            self.skip = None;
        }
    }

    /// A key was read whole (its closing quote emitted): what becomes of its member.
    fn key_read(&mut self, out: &mut Vec<u8>) {
        let key = self.key.strip_suffix(b"\"").unwrap_or(&self.key);
        let Injected {
            token_ids,
            logprobs,
            unasked,
        } = self.injected;
        let token_member = match unasked {
            Unasked::Null => Member::Null,
            Unasked::Absent => Member::Drop,
        };
        self.last_key = (self.role() == Some(Role::Top) && key == b"choices").then_some("choices");
        let member = match (self.role(), key) {
            (Some(Role::Top), b"prompt_token_ids") if token_ids => token_member,
            (Some(Role::Choice), b"prompt_token_ids" | b"token_ids") if token_ids => token_member,
            (Some(Role::Choice), b"logprobs") if logprobs => Member::Null,
            _ => Member::Keep,
        };
        self.decide(member, out);
    }

    /// Settles the member being read: its held bytes go out, or (dropped) go nowhere.
    fn decide(&mut self, member: Member, out: &mut Vec<u8>) {
        let Some(held) = self.held.take() else {
            self.member = Member::Keep;
            return;
        };
        self.member = member;
        if member == Member::Drop {
            // A member after another takes its comma with it; the first leaves the next one's.
            self.drop_comma = !held.contains(&b',');
            // The colon and value are skipped from here.
            self.skip = Some(self.stack.len());
            self.member = Member::Keep;
            return;
        }
        out.extend_from_slice(&held);
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        if let Some(held) = self.held.take() {
            if self.skip.is_none() {
                out.extend_from_slice(&held);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::strip::{strip, Stripped};
    use super::*;

    const VLLM: Injected = Injected {
        token_ids: true,
        logprobs: true,
        unasked: Unasked::Null,
    };
    const SGLANG: Injected = Injected {
        token_ids: true,
        logprobs: true,
        unasked: Unasked::Absent,
    };

    fn streamed(body: &str, injected: Injected, chunk: usize) -> String {
        let mut strip = StreamStrip::new(injected);
        let mut out = Vec::new();
        for part in body.as_bytes().chunks(chunk.max(1)) {
            out.extend(strip.push(part));
        }
        out.extend(strip.finish());
        String::from_utf8(out).unwrap()
    }

    fn whole(body: &str, injected: Injected) -> String {
        match strip(body.as_bytes(), &injected) {
            Stripped::Rewritten(edits) => String::from_utf8(edits.apply(body.as_bytes())).unwrap(),
            _ => body.to_owned(),
        }
    }

    const VLLM_BODY: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\" {[,]}","tool_calls":[]},"logprobs":{"content":[{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[]}]},"finish_reason":"stop","stop_reason":null,"token_ids":[9906,1070]}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2},"prompt_logprobs":null,"prompt_token_ids":[1,2,3,4,5],"kv_transfer_params":null}"#;

    #[test]
    fn a_body_streamed_in_any_chunks_is_stripped_as_a_whole_one() {
        for chunk in [1, 2, 3, 7, 64, 4096] {
            assert_eq!(
                streamed(VLLM_BODY, VLLM, chunk),
                whole(VLLM_BODY, VLLM),
                "chunks of {chunk}"
            );
        }
        let stripped: serde_json::Value =
            serde_json::from_str(&streamed(VLLM_BODY, VLLM, 5)).unwrap();
        assert_eq!(stripped["prompt_token_ids"], serde_json::Value::Null);
        assert_eq!(stripped["choices"][0]["token_ids"], serde_json::Value::Null);
        assert_eq!(stripped["choices"][0]["logprobs"], serde_json::Value::Null);
        assert_eq!(
            stripped["choices"][0]["message"]["content"],
            "Hi \"there\" {[,]}"
        );
    }

    #[test]
    fn sglangs_unasked_fields_go_with_their_keys() {
        let body = r#"{"id":"x","choices":[{"token_ids":[1,2],"index":0,"message":{"content":"a"},"logprobs":{"content":[]},"prompt_token_ids":[3]}],"prompt_token_ids":[4]}"#;
        for chunk in [1, 3, 100] {
            let out = streamed(body, SGLANG, chunk);
            let value: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| {
                panic!("{out}: {e}");
            });
            assert_eq!(
                value,
                serde_json::json!({"id":"x","choices":[{"index":0,"message":{"content":"a"},"logprobs":null}]})
            );
        }
    }

    #[test]
    fn nested_fields_of_the_same_names_stay() {
        let body = r#"{"choices":[{"message":{"content":"x","logprobs":1,"token_ids":[7]}}],"other":{"prompt_token_ids":[1]}}"#;
        assert_eq!(streamed(body, VLLM, 2), body);
    }

    proptest! {
        /// Whatever the engine put in its message, and wherever the body is cut into frames,
        /// the streamed strip gives what the whole strip gives.
        #[test]
        fn any_content_and_any_cut_strip_alike(
            content in ".{0,40}",
            ids in proptest::collection::vec(0u32..100_000, 0..6),
            chunk in 1usize..40,
        ) {
            let body = serde_json::json!({
                "id": "c", "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                "logprobs": {"content": []}, "token_ids": ids}], "prompt_token_ids": ids,
            })
            .to_string();
            for injected in [VLLM, SGLANG] {
                prop_assert_eq!(streamed(&body, injected, chunk), whole(&body, injected));
            }
        }
    }
}
