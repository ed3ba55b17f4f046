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
//!
//! What a body may expand to in memory is bounded as well as its bytes: it holds at most
//! `limits.max_body_values` JSON values (every message, content block, key's value and item
//! counts one), so a history of many tiny messages cannot take the memory of one made of few.

use std::cell::Cell;
use std::fmt;

use http::Method;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Why a body was refused; the message the agent reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(String);

/// The JSON object a POST carries, `None` for a request of another method (which must then come
/// without a body).
pub fn read(method: &Method, body: &[u8], max_values: usize) -> Result<Option<Value>, Unreadable> {
    if *method != Method::POST {
        return match body.is_empty() {
            true => Ok(None),
            false => Err(Unreadable(format!(
                "a {method} request carries no body; this one came with {} bytes",
                body.len()
            ))),
        };
    }
    object(body, max_values).map(Some)
}

/// `body` as a JSON object of at most `max_values` values, read strictly (see the module docs).
pub fn object(body: &[u8], max_values: usize) -> Result<Value, Unreadable> {
    let budget = Cell::new(max_values);
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = Strict { budget: &budget }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|e| match e.to_string().starts_with(TOO_MANY) {
            true => Unreadable(format!(
                "the request body holds more than {max_values} JSON values (limits.max_body_values)"
            )),
            false => Unreadable(format!("the request body is not valid JSON: {e}")),
        })?;
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

/// The message of the error that stops a body past its budget of values.
const TOO_MANY: &str = "too many values";

/// A JSON value whose objects hold no key twice, taking one unit of `budget` per value.
#[derive(Clone, Copy)]
struct Strict<'b> {
    budget: &'b Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self.budget.get() {
            0 => Err(de::Error::custom(TOO_MANY)),
            left => {
                self.budget.set(left - 1);
                deserializer.deserialize_any(self)
            }
        }
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
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
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
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
            let value = map.next_value_seed(self)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LOTS: usize = 1_000_000;

    fn refused(body: &[u8]) -> String {
        match object(body, LOTS) {
            Ok(value) => panic!("{} was read as {value}", String::from_utf8_lossy(body)),
            Err(Unreadable(message)) => message,
        }
    }

    #[test]
    fn a_standard_body_reads_as_serde_json_reads_it() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"h\u00e9"}],"n":1,"t":0.5,"x":null,"big":18446744073709551615,"neg":-3}"#;
        assert_eq!(
            object(body, LOTS).unwrap(),
            serde_json::from_slice::<Value>(body).unwrap()
        );
        assert_eq!(
            object(br#"{"a":{"b":[1,{"c":true}]}}"#, LOTS).unwrap(),
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
        object(br#"{"a":{"k":1},"b":{"k":2}}"#, LOTS).unwrap();
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
        object(br#"{"messages":[]}"#, LOTS).unwrap();
    }

    #[test]
    fn a_request_that_is_not_a_post_carries_no_body() {
        assert_eq!(read(&Method::GET, b"", LOTS), Ok(None));
        assert!(read(&Method::GET, br#"{"model":"bravo@v1"}"#, LOTS).is_err());
        assert!(read(&Method::POST, b"", LOTS).is_err());
    }

    #[test]
    fn a_body_holds_at_most_its_budget_of_values() {
        // The object, `model`'s value, `messages`, one message, its two values: 6.
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        object(body, 6).unwrap();
        let message = refused_with(body, 5);
        assert!(message.contains("more than 5 JSON values"), "{message}");
        // Many tiny messages in few bytes: refused long before they are all built.
        let many = format!(
            r#"{{"model":"m","messages":[{}]}}"#,
            vec![r#"{"role":"user","content":""}"#; 100_000].join(",")
        );
        assert!(refused_with(many.as_bytes(), 10_000).contains("JSON values"));
    }

    fn refused_with(body: &[u8], max_values: usize) -> String {
        match object(body, max_values) {
            Ok(value) => panic!("{value} was read"),
            Err(Unreadable(message)) => message,
        }
    }
}
