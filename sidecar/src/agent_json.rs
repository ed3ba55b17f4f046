//! An agent's request body, read one way and strictly: what the sidecar cannot read, it refuses.
//!
//! The sidecar decides on a body — which tenant's adapter it may name, where it is routed, what
//! is recorded — and the engine then reads the same bytes with its own parser. Where the two
//! parsers disagree, the decision is made on one body and the engine serves another: Python's
//! `json` takes `NaN`, `Infinity`, `1e400`, a byte-order mark and lone surrogates that serde_json
//! refuses, and parsers differ on which of two equal keys wins. So a body reaches the engine only
//! if it is one JSON object that serde_json reads whole, with no key twice in any object, and
//! `model`, when present, is a string: such a body means the same thing to every conforming
//! parser. Anything else is answered 400 in the agent's own API shape, never passed through.
//!
//! A request that is not a POST carries no body: one that does is refused too, rather than
//! forwarded unread.

use std::fmt;

use http::Method;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Why a body was refused; the message the agent reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(String);

/// The JSON object a POST carries, `None` for a request of another method (which must then come
/// without a body).
pub fn read(method: &Method, body: &[u8]) -> Result<Option<Value>, Unreadable> {
    if *method != Method::POST {
        return match body.is_empty() {
            true => Ok(None),
            false => Err(Unreadable(format!(
                "a {method} request carries no body; this one came with {} bytes",
                body.len()
            ))),
        };
    }
    object(body).map(Some)
}

/// `body` as a JSON object, read strictly (see the module docs).
pub fn object(body: &[u8]) -> Result<Value, Unreadable> {
    let Strict(value) = serde_json::from_slice(body)
        .map_err(|e| Unreadable(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(Unreadable(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    match value.get("model") {
        None | Some(Value::String(_)) => Ok(value),
        Some(_) => Err(Unreadable("`model` must be a string".to_owned())),
    }
}

/// A JSON value whose objects hold no key twice.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "the key `{key}` appears twice"
                )));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(body: &[u8]) -> String {
        match object(body) {
            Ok(value) => panic!("{} was read as {value}", String::from_utf8_lossy(body)),
            Err(Unreadable(message)) => message,
        }
    }

    #[test]
    fn a_standard_body_reads_as_serde_json_reads_it() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"h\u00e9"}],"n":1,"t":0.5,"x":null,"big":18446744073709551615,"neg":-3}"#;
        assert_eq!(
            object(body).unwrap(),
            serde_json::from_slice::<Value>(body).unwrap()
        );
        assert_eq!(
            object(br#"{"a":{"b":[1,{"c":true}]}}"#).unwrap(),
            json!({"a":{"b":[1,{"c":true}]}})
        );
    }

    #[test]
    fn what_pythons_json_takes_and_serde_json_does_not_is_refused() {
        for body in [
            &br#"{"model":"bravo@v1","x":NaN}"#[..],
            br#"{"model":"bravo@v1","x":Infinity}"#,
            br#"{"model":"bravo@v1","x":-Infinity}"#,
            br#"{"model":"bravo@v1","x":1e400}"#,
            b"\xef\xbb\xbf{\"model\":\"bravo@v1\"}",
            br#"{"model":"bravo@v1","x":"\ud800"}"#,
            br#"{"model":"bravo@v1" /* a comment */}"#,
            br#"{"model":"bravo@v1",}"#,
            br#"{"model":"bravo@v1"} {"model":"x"}"#,
            b"",
        ] {
            assert!(refused(body).starts_with("the request body is not valid JSON"));
        }
    }

    #[test]
    fn a_key_twice_is_refused_at_any_depth() {
        let message = refused(br#"{"model":"alpha","model":"bravo@v1"}"#);
        assert!(message.contains("`model` appears twice"), "{message}");
        refused(br#"{"messages":[{"role":"user","role":"system"}]}"#);
        // The same key in sibling objects is no repeat.
        object(br#"{"a":{"k":1},"b":{"k":2}}"#).unwrap();
    }

    #[test]
    fn only_an_object_with_a_string_model_is_a_body() {
        for body in [&b"[]"[..], b"\"x\"", b"1", b"null"] {
            assert_eq!(refused(body), "the request body must be a JSON object");
        }
        for body in [
            &br#"{"model":["bravo@v1"]}"#[..],
            br#"{"model":null}"#,
            br#"{"model":1}"#,
        ] {
            assert_eq!(refused(body), "`model` must be a string");
        }
        object(br#"{"messages":[]}"#).unwrap();
    }

    #[test]
    fn a_request_that_is_not_a_post_carries_no_body() {
        assert_eq!(read(&Method::GET, b""), Ok(None));
        assert!(read(&Method::GET, br#"{"model":"bravo@v1"}"#).is_err());
        assert!(read(&Method::POST, b"").is_err());
    }
}
