//! Properties of what parses agent and engine input, over generated inputs (bounded: they run in
//! the test command). Each holds for every input, not only the captured fixtures:
//! - the SSE splitter gives the same events however the stream is cut into frames, and every
//!   byte comes out exactly once;
//! - the stitching canonicaliser hashes re-encodings of one conversation alike (key order,
//!   content as a string or as text parts, tool-call arguments re-serialised, padding) and
//!   different conversations apart;
//! - routing, the agent allow-list and request parsing never panic on any path, header or body,
//!   and nothing with an engine control word is ever allowed.

use clawback_datapool::{Endpoint, TenantId};
use clawback_sidecar::data_plane::capture::SseSplitter;
use clawback_sidecar::data_plane::layers::agent_api::{
    is_engine_control, AgentApiConfig, AllowList,
};
use clawback_sidecar::data_plane::recorder::request;
use clawback_sidecar::data_plane::session::canonical::HistoryHasher;
use clawback_sidecar::data_plane::session::explicit::Hints;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// 256 cases a property (proptest's default; `PROPTEST_CASES=N` for a longer run).
fn config() -> ProptestConfig {
    ProptestConfig::default()
}

// ---- SSE ----

/// One event as an engine writes it: optional `event:` name, one or more `data:` lines, and a
/// line ending (`\n`, `\r\n` or `\r`).
fn event() -> impl Strategy<Value = String> {
    let line_end = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
    (
        proptest::option::of("[a-z.]{1,12}"),
        proptest::collection::vec("[ -~]{0,40}", 1..3),
        line_end,
    )
        .prop_map(|(name, data, end)| {
            let mut out = String::new();
            if let Some(name) = name {
                out.push_str(&format!("event: {name}{end}"));
            }
            for line in data {
                out.push_str(&format!("data: {line}{end}"));
            }
            out.push_str(end);
            out
        })
}

/// The events (raw bytes) and the unfinished rest of `stream` pushed in frames cut at `cuts`.
fn split(stream: &[u8], cuts: &[usize]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut splitter = SseSplitter::new();
    let mut events = Vec::new();
    let mut at = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    points.sort_unstable();
    points.push(stream.len());
    for point in points {
        splitter.push(&stream[at..point]);
        at = point;
        while let Some(event) = splitter.next_event() {
            events.push(event.raw.to_vec());
        }
    }
    let rest = splitter.finish().map(|b| b.to_vec()).unwrap_or_default();
    (events, rest)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sse_events_do_not_depend_on_where_frames_are_cut(
        events in proptest::collection::vec(event(), 1..8),
        tail in "[ -~]{0,20}",
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let stream = format!("{}{tail}", events.concat()).into_bytes();
        let (whole, whole_rest) = split(&stream, &[]);
        let (cut, cut_rest) = split(&stream, &cuts);
        prop_assert_eq!(&whole, &cut);
        prop_assert_eq!(&whole_rest, &cut_rest);
        // Every byte pushed comes out once.
        let out: Vec<u8> = cut.concat().into_iter().chain(cut_rest).collect();
        prop_assert_eq!(out, stream);
    }

    #[test]
    fn sse_never_panics_and_loses_no_byte_of_arbitrary_input(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let (events, rest) = split(&bytes, &cuts);
        let total: usize = events.iter().map(Vec::len).sum::<usize>() + rest.len();
        prop_assert_eq!(total, bytes.len());
    }
}

// ---- stitching canonicaliser ----

#[derive(Debug, Clone)]
enum Turn {
    User(String),
    Assistant(String, Option<(String, Map<String, Value>)>),
    Tool(String),
}

fn turn() -> impl Strategy<Value = Turn> {
    let text = "[a-zA-Z0-9 ,.?]{0,30}[a-zA-Z0-9]";
    let args = proptest::collection::btree_map("[a-z]{1,6}", 0i64..1000, 0..4).prop_map(|m| {
        m.into_iter()
            .map(|(k, v)| (k, json!(v)))
            .collect::<Map<String, Value>>()
    });
    prop_oneof![
        text.prop_map(Turn::User),
        (text, proptest::option::of(("[a-z_]{1,10}", args)))
            .prop_map(|(t, call)| Turn::Assistant(t, call)),
        text.prop_map(Turn::Tool),
    ]
}

/// The conversation as chat messages; `reencode` writes it as another client would: content as
/// text parts (with padding where the message is a turn of its own), keys in another order, arguments re-serialised with spaces and
/// reversed keys, call ids with other punctuation.
fn messages(turns: &[Turn], reencode: bool) -> Vec<Value> {
    turns
        .iter()
        .enumerate()
        .map(|(i, turn)| {
            // Padding is trimmed per turn, and consecutive assistant messages are one turn: only
            // the messages that are a turn of their own are padded.
            let pad = !matches!(turn, Turn::Assistant(..));
            let content = |text: &str| match (reencode, pad) {
                (true, true) => json!([{"text": format!("  {text}\n"), "type": "text"}]),
                (true, false) => json!([{"type": "text", "text": text}]),
                (false, _) => json!(text),
            };
            let call_id = if reencode {
                format!("call-{i}")
            } else {
                format!("call_{i}")
            };
            match turn {
                Turn::User(text) if reencode => json!({"content": content(text), "role": "user"}),
                Turn::User(text) => json!({"role": "user", "content": content(text)}),
                Turn::Assistant(text, call) => {
                    let mut message = json!({"role": "assistant", "content": content(text)});
                    if let Some((name, args)) = call {
                        let arguments = if reencode {
                            let reversed: Map<String, Value> = args
                                .iter()
                                .rev()
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect();
                            serde_json::to_string_pretty(&Value::Object(reversed))
                                .unwrap_or_default()
                        } else {
                            Value::Object(args.clone()).to_string()
                        };
                        message["tool_calls"] = json!([{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": arguments}}]);
                    }
                    message
                }
                Turn::Tool(text) => {
                    json!({"role": "tool", "tool_call_id": call_id, "content": content(text)})
                }
            }
        })
        .collect()
}

fn hashes(tenant: &TenantId, history: &[Value]) -> Vec<u128> {
    let mut hasher = HistoryHasher::new(tenant);
    for item in history {
        hasher.push(item);
    }
    hasher.finish().into_iter().map(|b| b.hash).collect()
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let word = prop_oneof![
        Just("role".to_owned()),
        Just("assistant".to_owned()),
        Just("tool".to_owned()),
        Just("text".to_owned()),
        Just("function_call".to_owned()),
        ".{0,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        word.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let keys = prop_oneof![
            Just("role".to_owned()),
            Just("content".to_owned()),
            Just("type".to_owned()),
            Just("tool_calls".to_owned()),
            Just("arguments".to_owned()),
            Just("function".to_owned()),
            Just("messages".to_owned()),
            Just("input".to_owned()),
            Just("call_id".to_owned()),
            "[a-z_]{1,8}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(keys, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_reencoded_conversation_hashes_alike(turns in proptest::collection::vec(turn(), 1..10)) {
        let tenant = TenantId::new("acme").unwrap();
        prop_assert_eq!(
            hashes(&tenant, &messages(&turns, false)),
            hashes(&tenant, &messages(&turns, true))
        );
    }

    #[test]
    fn different_conversations_or_tenants_hash_apart(
        turns in proptest::collection::vec(turn(), 1..8),
        extra in "[a-z]{1,10}",
    ) {
        let acme = TenantId::new("acme").unwrap();
        let mut history = messages(&turns, false);
        history.push(json!({"role": "assistant", "content": "reply"}));
        let mut changed = history.clone();
        let first = changed[0]["content"].as_str().unwrap_or_default().to_owned();
        changed[0]["content"] = json!(format!("{first} {extra}"));
        let (a, b) = (hashes(&acme, &history), hashes(&acme, &changed));
        prop_assert_eq!(a.len(), b.len());
        prop_assert_ne!(a.last(), b.last());
        let other = TenantId::new("other").unwrap();
        prop_assert_ne!(hashes(&other, &history), a);
    }

    #[test]
    fn the_canonicaliser_never_panics_on_arbitrary_json(value in arbitrary_json()) {
        let tenant = TenantId::new("acme").unwrap();
        let mut hasher = HistoryHasher::new(&tenant);
        hasher.push(&value);
        hasher.push_reply(&value);
        let _ = hasher.finish();
    }
}

// ---- request parsing ----

proptest! {
    #![proptest_config(config())]

    #[test]
    fn routing_and_the_allow_list_hold_for_any_path(
        method in prop_oneof![Just("GET"), Just("POST"), Just("DELETE"), Just("PUT")],
        path in "(/[a-zA-Z0-9_%.@:-]{0,12}){0,5}",
        query in proptest::option::of("[a-z=&%0-9]{0,16}"),
    ) {
        let method = http::Method::from_bytes(method.as_bytes()).unwrap();
        let allow = AllowList::new(&AgentApiConfig::default()).unwrap();
        // The whole door: the control plane's routes (Claw-R1's base URLs among them) too.
        let route = clawback_sidecar::app::classify(&method, &path, query.as_deref());
        if let Some(upstream_path) = route.upstream_path() {
            prop_assert!(upstream_path.starts_with("/v1"));
            let bare = upstream_path.split('?').next().unwrap_or_default();
            if is_engine_control(bare) {
                prop_assert!(!allow.allows(&method, bare));
            }
        }
        for control in ["load_lora_adapter", "unload_lora_adapter", "update_weights_from_disk", "sleep"] {
            let reached = format!("{path}/{control}");
            prop_assert!(!allow.allows(&method, &reached), "{} allowed", reached);
        }
    }

    #[test]
    fn request_parsing_never_panics_on_any_body(body in arbitrary_json(), session in ".{0,40}") {
        for endpoint in [Endpoint::ChatCompletions, Endpoint::Completions, Endpoint::Responses] {
            let messages = request::messages(endpoint, &body);
            let _ = request::step_request(messages, &body);
        }
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::from_str(&session) {
            headers.insert("x-clawback-session", value.clone());
            headers.insert("x-clawback-group", value);
        }
        let _ = Hints::read(None, &headers, Some(&body));
    }
}
