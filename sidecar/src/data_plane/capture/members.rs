//! One scan of a chat or completions event — a streamed chunk or a whole body — that finds the
//! members the capture reads, each as its raw text in the event: the assembler parses what it
//! keeps from that text ([`super::assemble`]) and the strip cuts what the sidecar injected out
//! of the event's bytes ([`super::strip`]). Every other value is skipped unparsed, so an event is
//! scanned once for both, and its many logprob entries are parsed once, by the assembler.
//!
//! An event that is not a JSON object, or that repeats one of these keys (no engine writes one),
//! does not scan: the strip then leaves it alone and the assembler reads it as a tree.

use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The members of an event the capture reads, each as the raw text it has in the event (`null`
/// included: a present `null` is not an absent key).
#[derive(Debug, Deserialize)]
pub struct Members<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    pub prompt_token_ids: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    pub usage: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    pub model: Option<&'a RawValue>,
    // What makes an event an error answer.
    #[serde(default, borrow, deserialize_with = "present")]
    pub error: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    pub object: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present", rename = "type")]
    pub kind: Option<&'a RawValue>,
    /// `choices` when it is an array: its elements, `None` for one that is not an object.
    #[serde(default, borrow, deserialize_with = "choices")]
    pub choices: Option<Vec<Option<ChoiceMembers<'a>>>>,
}

/// The members of one element of `choices` the capture reads.
#[derive(Debug, Deserialize)]
pub struct ChoiceMembers<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    pub index: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    pub prompt_token_ids: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    pub token_ids: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    pub logprobs: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    pub finish_reason: Option<&'a RawValue>,
    /// A streamed choice's part.
    #[serde(default, borrow, deserialize_with = "present")]
    pub delta: Option<&'a RawValue>,
    /// A whole chat answer's part.
    #[serde(default, borrow, deserialize_with = "present")]
    pub message: Option<&'a RawValue>,
    /// A completions choice's text.
    #[serde(default, borrow, deserialize_with = "present")]
    pub text: Option<&'a RawValue>,
}

impl<'a> Members<'a> {
    /// Scans `event`; `None` when it is not a JSON object with each of these keys at most once.
    pub fn scan(event: &'a [u8]) -> Option<Self> {
        serde_json::from_slice(event).ok()
    }

    /// The elements of `choices` that are objects.
    pub fn object_choices(&self) -> impl Iterator<Item = &ChoiceMembers<'a>> {
        self.choices.iter().flatten().flatten()
    }
}

/// A member that is there, `null` or not (`Option`'s own reading would make `null` absent).
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// `choices`: its elements when it is an array, `None` when it is anything else.
fn choices<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<Option<ChoiceMembers<'de>>>>, D::Error> {
    deserializer.deserialize_any(Elements)
}

/// Reads an array's elements as [`ChoiceMembers`] (`None` for one that is not an object); an
/// array is `Some`, anything else `None`.
struct Elements;

/// A visitor's answer to any JSON scalar (`null`, a boolean, a number, a string).
macro_rules! scalars_are {
    ($value:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

impl<'de> Visitor<'de> for Elements {
    type Value = Option<Vec<Option<ChoiceMembers<'de>>>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("choices")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut choices = Vec::new();
        while let Some(choice) = seq.next_element_seed(Element)? {
            choices.push(choice);
        }
        Ok(Some(choices))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny::deserialize(MapAccessDeserializer::new(map))?;
        Ok(None)
    }

    scalars_are!(None);
}

/// One element of `choices`: `Some` for an object, `None` for anything else.
struct Element;

impl<'de> DeserializeSeed<'de> for Element {
    type Value = Option<ChoiceMembers<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Element {
    type Value = Option<ChoiceMembers<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a choice")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        ChoiceMembers::deserialize(MapAccessDeserializer::new(map)).map(Some)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        IgnoredAny::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok(None)
    }

    scalars_are!(None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_found_as_their_text_and_the_rest_is_skipped() {
        let event = br#"{"id":"c","model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"x":[1]},7],"prompt_token_ids":[1, 2]}"#;
        let members = Members::scan(event).expect("an object");
        assert_eq!(members.model.map(RawValue::get), Some(r#""m""#));
        assert_eq!(members.prompt_token_ids.map(RawValue::get), Some("[1, 2]"));
        assert!(members.usage.is_none());
        let choices = members.choices.as_deref().unwrap_or_default();
        assert_eq!(choices.len(), 2);
        assert!(choices[1].is_none(), "a number is no choice");
        let choice = members.object_choices().next().expect("one object");
        assert_eq!(choice.logprobs.map(RawValue::get), Some("null"));
        assert_eq!(choice.delta.map(RawValue::get), Some("{}"));
    }

    #[test]
    fn choices_that_are_no_array_and_events_that_are_no_object() {
        let members = Members::scan(br#"{"choices":{"a":1}}"#).expect("an object");
        assert!(members.choices.is_none());
        assert!(Members::scan(b"[DONE]").is_none());
        assert!(Members::scan(br#"{"model":"a","model":"b"}"#).is_none());
    }
}
