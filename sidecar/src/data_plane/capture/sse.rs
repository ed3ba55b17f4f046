//! An incremental splitter for server-sent events: upstream frames arrive cut anywhere (an event
//! split across frames, several events in one frame), and the capture needs whole events.
//!
//! Every byte pushed comes back out exactly once — in the `raw` of an event, or in the remainder
//! [`SseSplitter::finish`] returns — so a relay that forwards `raw` forwards the stream unchanged.
//! Lines may end in `\n`, `\r\n` or a lone `\r`, as the SSE specification allows.

use bytes::{Bytes, BytesMut};

/// One complete event: everything up to and including the blank line that ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The event's bytes exactly as they arrived, terminating blank line included.
    pub raw: Bytes,
    /// The `event:` field, when the event has one (the Responses API names its events).
    pub event: Option<String>,
    /// The `data:` payload, several `data:` lines joined with `\n`; `None` for an event without
    /// data (a comment or keep-alive), which is still forwarded but carries nothing to assemble.
    pub data: Option<Bytes>,
}

impl SseEvent {
    /// Whether this is the `data: [DONE]` sentinel that ends an OpenAI-style stream.
    pub fn is_done(&self) -> bool {
        self.data.as_deref() == Some(b"[DONE]".as_slice())
    }
}

/// Cuts a byte stream into [`SseEvent`]s. Push frames with [`push`](Self::push), then drain
/// complete events with [`next_event`](Self::next_event).
#[derive(Debug, Default)]
pub struct SseSplitter {
    /// Bytes of the event being read; the event starts at index 0.
    buf: BytesMut,
    /// How far lines of the current event have been parsed.
    parsed: usize,
    event: Option<String>,
    data: Data,
}

/// Where the current event's data is, without copying it while there is only one `data:` line
/// (the usual case).
#[derive(Debug, Default)]
enum Data {
    #[default]
    None,
    /// One line: a range of `buf`.
    Range(usize, usize),
    /// Several lines, already joined.
    Joined(Vec<u8>),
}

impl SseSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a frame as it arrived from upstream.
    pub fn push(&mut self, frame: &[u8]) {
        self.buf.extend_from_slice(frame);
    }

    /// Whether no bytes are waiting for the rest of their event.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The next complete event, or `None` until more bytes arrive.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            let (line_end, next) = self.next_line()?;
            let start = self.parsed;
            self.parsed = next;
            if line_end == start {
                return Some(self.take_event(next));
            }
            self.field(start, line_end);
        }
    }

    /// What is left when the stream ends: an event cut off before its blank line. The SSE
    /// specification discards such an event, so it is returned only as bytes to forward.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.parsed = 0;
        self.event = None;
        self.data = Data::None;
        if self.buf.is_empty() {
            None
        } else {
            Some(self.buf.split().freeze())
        }
    }

    /// The end of the next whole line from `parsed` and where the line after it starts.
    fn next_line(&self) -> Option<(usize, usize)> {
        let rest = &self.buf[self.parsed..];
        let at = memchr::memchr2(b'\n', b'\r', rest)?;
        let end = self.parsed + at;
        if rest[at] == b'\n' {
            return Some((end, end + 1));
        }
        // A `\r` at the very end may be the first half of `\r\n`: wait for the next byte rather
        // than count the `\n` as a blank line that ends the event early.
        match rest.get(at + 1) {
            None => None,
            Some(b'\n') => Some((end, end + 2)),
            Some(_) => Some((end, end + 1)),
        }
    }

    /// Takes in one `name: value` line of the current event.
    fn field(&mut self, start: usize, end: usize) {
        let line = &self.buf[start..end];
        let (name, value_start) = match line.iter().position(|&b| b == b':') {
            // A comment line.
            Some(0) => return,
            Some(colon) => {
                let value = start + colon + 1;
                let skip_space = usize::from(self.buf.get(value) == Some(&b' ') && value < end);
                (&line[..colon], value + skip_space)
            }
            None => (line, end),
        };
        match name {
            b"data" => {
                self.data = match std::mem::take(&mut self.data) {
                    Data::None => Data::Range(value_start, end),
                    Data::Range(s, e) => {
                        let mut joined = self.buf[s..e].to_vec();
                        joined.push(b'\n');
                        joined.extend_from_slice(&self.buf[value_start..end]);
                        Data::Joined(joined)
                    }
                    Data::Joined(mut joined) => {
                        joined.push(b'\n');
                        joined.extend_from_slice(&self.buf[value_start..end]);
                        Data::Joined(joined)
                    }
                }
            }
            b"event" => {
                self.event =
                    Some(String::from_utf8_lossy(&self.buf[value_start..end]).into_owned());
            }
            // `id:`, `retry:` and unknown fields mean nothing to the capture.
            _ => {}
        }
    }

    fn take_event(&mut self, end: usize) -> SseEvent {
        let raw = self.buf.split_to(end).freeze();
        self.parsed = 0;
        let data = match std::mem::take(&mut self.data) {
            Data::None => None,
            Data::Range(s, e) => Some(raw.slice(s..e)),
            Data::Joined(joined) => Some(Bytes::from(joined)),
        };
        SseEvent {
            raw,
            event: self.event.take(),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real vLLM chunk pair, a Responses API event and a keep-alive comment.
    const STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        ": keep-alive\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
        "data: [DONE]\n\n",
    );

    fn split_whole(input: &[u8]) -> (Vec<SseEvent>, Option<Bytes>) {
        split_frames(&[input])
    }

    fn split_frames(frames: &[&[u8]]) -> (Vec<SseEvent>, Option<Bytes>) {
        let mut splitter = SseSplitter::new();
        let mut events = Vec::new();
        for frame in frames {
            splitter.push(frame);
            while let Some(event) = splitter.next_event() {
                events.push(event);
            }
        }
        let rest = splitter.finish();
        (events, rest)
    }

    #[test]
    fn events_come_out_whole_with_their_names_and_data() {
        let (events, rest) = split_whole(STREAM.as_bytes());
        assert_eq!(events.len(), 4);
        assert!(rest.is_none());
        assert!(events[0]
            .data
            .as_deref()
            .is_some_and(|d| d.starts_with(b"{\"id\"")));
        assert_eq!(events[0].event, None);
        assert_eq!(events[1].data, None, "a comment carries no data");
        assert_eq!(
            events[2].event.as_deref(),
            Some("response.output_text.delta")
        );
        assert!(events[3].is_done());
    }

    #[test]
    fn a_frame_split_at_every_byte_position_gives_the_same_events() {
        let input = STREAM.as_bytes();
        let (whole, _) = split_whole(input);
        for cut in 0..=input.len() {
            let (events, rest) = split_frames(&[&input[..cut], &input[cut..]]);
            assert_eq!(events, whole, "cut at byte {cut}");
            assert!(rest.is_none());
        }
    }

    #[test]
    fn one_byte_frames_give_the_same_events() {
        let input = STREAM.as_bytes();
        let frames: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(split_frames(&frames).0, split_whole(input).0);
    }

    #[test]
    fn crlf_line_endings_split_at_every_byte_position() {
        let input = STREAM.replace('\n', "\r\n");
        let input = input.as_bytes();
        let (whole, _) = split_whole(input);
        assert_eq!(whole.len(), 4);
        assert!(whole[3].is_done());
        assert_eq!(
            whole[2].event.as_deref(),
            Some("response.output_text.delta")
        );
        for cut in 0..=input.len() {
            assert_eq!(split_frames(&[&input[..cut], &input[cut..]]).0, whole);
        }
    }

    #[test]
    fn lone_carriage_returns_end_lines_too() {
        // A `\r` is known to stand alone only once the next byte is in: here a keep-alive.
        let (events, _) = split_whole(b"data: a\r\rdata: b\r\r:\r\r");
        let data: Vec<_> = events.iter().filter_map(|e| e.data.clone()).collect();
        assert_eq!(data, vec![Bytes::from("a"), Bytes::from("b")]);
    }

    #[test]
    fn every_byte_comes_back_out_in_order() {
        let input = format!("{STREAM}data: {{\"cut\": tr");
        let (events, rest) = split_whole(input.as_bytes());
        let mut out: Vec<u8> = events.iter().flat_map(|e| e.raw.to_vec()).collect();
        out.extend_from_slice(rest.as_deref().unwrap_or_default());
        assert_eq!(out, input.as_bytes());
        assert_eq!(rest.as_deref(), Some(b"data: {\"cut\": tr".as_slice()));
    }

    #[test]
    fn several_data_lines_are_joined_with_newlines() {
        let (events, _) = split_whole(b"data: {\"a\":\ndata:1}\n\n");
        assert_eq!(events[0].data.as_deref(), Some(b"{\"a\":\n1}".as_slice()));
    }

    #[test]
    fn a_field_without_a_space_after_the_colon_keeps_its_whole_value() {
        let (events, _) = split_whole(b"event:done\ndata:[DONE]\n\n");
        assert_eq!(events[0].event.as_deref(), Some("done"));
        assert!(events[0].is_done());
    }
}
