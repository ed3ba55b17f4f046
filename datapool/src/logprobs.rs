//! A completion's logprobs held column by column: [`CompletionLogprobs`].
//!
//! An engine answers with one `{"token", "logprob", "bytes", "top_logprobs"}` object per sampled
//! token, and held as one struct per token (a string and a byte vector each) a 256-token answer
//! was 512 heap objects and ~21 kB per step in flight: most of what the recorder allocated per
//! call, and of what 256 streams in flight held. Here the logprobs are one vector of f64s, the
//! tokens' text one string with where each token ends, a token's bytes kept only where they are
//! not its text's UTF-8, and the alternatives only where a token has some. The JSON is the same
//! as before: an array of entries ([`TokenRef`] each), or the stores' packed columns
//! ([`crate::packed`]); both read into this type without an object per token.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::packed;
use crate::schema::{TokenLogprob, TopLogprob};

/// `choices[0].logprobs.content`: one entry per completion token, held as columns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompletionLogprobs {
    logprobs: Vec<f64>,
    /// Every token's text, one after another.
    text: String,
    /// Where each token's text ends in `text`.
    ends: Vec<u32>,
    /// The tokens whose `bytes` are not their text's UTF-8 (absent, or a partial character),
    /// by index, ascending.
    odd_bytes: Vec<(u32, Option<Vec<u8>>)>,
    /// One list per token once any token has alternatives; empty until then.
    top: Vec<Vec<TopLogprob>>,
}

/// One token's entry, borrowed from the columns.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TokenRef<'a> {
    pub token: &'a str,
    pub logprob: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<&'a [u8]>,
    #[serde(skip_serializing_if = "<[TopLogprob]>::is_empty")]
    pub top_logprobs: &'a [TopLogprob],
}

impl TokenRef<'_> {
    /// The entry as an owned [`TokenLogprob`].
    pub fn to_entry(&self) -> TokenLogprob {
        TokenLogprob {
            token: self.token.to_owned(),
            logprob: self.logprob,
            bytes: self.bytes.map(<[u8]>::to_vec),
            top_logprobs: self.top_logprobs.to_vec(),
        }
    }
}

impl CompletionLogprobs {
    pub fn len(&self) -> usize {
        self.logprobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.logprobs.is_empty()
    }

    /// The tokens' logprobs, in order.
    pub fn logprobs(&self) -> &[f64] {
        &self.logprobs
    }

    /// Adds a token's entry at the end.
    pub fn push(
        &mut self,
        token: &str,
        logprob: f64,
        bytes: Option<&[u8]>,
        top_logprobs: Vec<TopLogprob>,
    ) {
        let index = self.index_of_next();
        if bytes != Some(token.as_bytes()) {
            self.odd_bytes.push((index, bytes.map(<[u8]>::to_vec)));
        }
        if !top_logprobs.is_empty() || self.has_alternatives() {
            self.top.resize_with(self.len(), Vec::new);
            self.top.push(top_logprobs);
        }
        self.logprobs.push(logprob);
        self.text.push_str(token);
        self.ends.push(self.end_of_text());
    }

    /// Adds `other`'s entries at the end (a streamed chunk's to the answer's).
    pub fn append(&mut self, other: CompletionLogprobs) {
        if self.is_empty() {
            *self = other;
            return;
        }
        let offset = self.index_of_next();
        let text_offset = self.end_of_text();
        if other.has_alternatives() || self.has_alternatives() {
            self.top.resize_with(self.len(), Vec::new);
            if other.has_alternatives() {
                self.top.extend(other.top);
            } else {
                self.top.resize_with(self.len() + other.len(), Vec::new);
            }
        }
        self.odd_bytes.extend(
            other
                .odd_bytes
                .into_iter()
                .map(|(index, bytes)| (index + offset, bytes)),
        );
        self.logprobs.extend(other.logprobs);
        self.text.push_str(&other.text);
        self.ends
            .extend(other.ends.into_iter().map(|end| end + text_offset));
    }

    /// Reads an array of entries (an engine's `logprobs.content`) onto the end of these: no
    /// columns of their own for a streamed chunk's one or two tokens. On an error nothing is
    /// added.
    pub fn append_from<'de, D: Deserializer<'de>>(&mut self, entries: D) -> Result<(), D::Error> {
        let before = self.len();
        let read = entries.deserialize_seq(AppendEntries(self));
        if read.is_err() {
            self.truncate(before);
        }
        read
    }

    /// Keeps the first `len` entries.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        self.logprobs.truncate(len);
        self.ends.truncate(len);
        self.text
            .truncate(self.ends.last().map_or(0, |&end| end as usize));
        self.odd_bytes.retain(|&(index, _)| (index as usize) < len);
        if self.top.iter().take(len).all(Vec::is_empty) {
            self.top.clear();
        } else {
            self.top.truncate(len);
        }
    }

    /// Entry `index`, when there is one.
    pub fn get(&self, index: usize) -> Option<TokenRef<'_>> {
        let start = match index {
            0 => 0,
            _ => *self.ends.get(index - 1)? as usize,
        };
        let odd = self
            .odd_bytes
            .partition_point(|&(odd, _)| (odd as usize) < index);
        Iter {
            columns: self,
            index,
            start,
            odd,
        }
        .next()
    }

    /// The entries, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            columns: self,
            index: 0,
            start: 0,
            odd: 0,
        }
    }

    /// Whether every token's bytes are its text's UTF-8 (the packed form then leaves them out).
    pub(crate) fn bytes_are_the_text(&self) -> bool {
        self.odd_bytes.is_empty()
    }

    /// Whether some token has alternatives.
    pub(crate) fn has_alternatives(&self) -> bool {
        !self.top.is_empty()
    }

    fn index_of_next(&self) -> u32 {
        u32::try_from(self.len()).unwrap_or(u32::MAX)
    }

    fn end_of_text(&self) -> u32 {
        u32::try_from(self.text.len()).unwrap_or(u32::MAX)
    }
}

/// The entries of [`CompletionLogprobs`], in order.
pub struct Iter<'a> {
    columns: &'a CompletionLogprobs,
    index: usize,
    /// Where the next token's text starts.
    start: usize,
    /// The first of `odd_bytes` at or after `index`.
    odd: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = TokenRef<'a>;

    fn next(&mut self) -> Option<TokenRef<'a>> {
        let columns = self.columns;
        let logprob = *columns.logprobs.get(self.index)?;
        let end = *columns.ends.get(self.index)? as usize;
        let token = columns.text.get(self.start..end)?;
        let bytes = match columns.odd_bytes.get(self.odd) {
            Some((odd, bytes)) if *odd as usize == self.index => {
                self.odd += 1;
                bytes.as_deref()
            }
            _ => Some(token.as_bytes()),
        };
        let top_logprobs = columns.top.get(self.index).map_or(&[][..], Vec::as_slice);
        self.index += 1;
        self.start = end;
        Some(TokenRef {
            token,
            logprob,
            bytes,
            top_logprobs,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.columns.len().saturating_sub(self.index);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a CompletionLogprobs {
    type Item = TokenRef<'a>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl From<Vec<TokenLogprob>> for CompletionLogprobs {
    fn from(entries: Vec<TokenLogprob>) -> Self {
        entries.into_iter().collect()
    }
}

impl FromIterator<TokenLogprob> for CompletionLogprobs {
    fn from_iter<I: IntoIterator<Item = TokenLogprob>>(entries: I) -> Self {
        let mut columns = Self::default();
        for entry in entries {
            columns.push(
                &entry.token,
                entry.logprob,
                entry.bytes.as_deref(),
                entry.top_logprobs,
            );
        }
        columns
    }
}

impl Serialize for CompletionLogprobs {
    /// Packed columns for a store ([`crate::packed`]), an array of entries otherwise.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if packed::is_packed() {
            return packed::write_logprobs(self, serializer);
        }
        serializer.collect_seq(self)
    }
}

impl<'de> Deserialize<'de> for CompletionLogprobs {
    /// Either form: an array of entries, or the packed columns.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = CompletionLogprobs;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("logprobs: an array of entries, or their packed columns")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let mut columns = CompletionLogprobs::default();
                AppendEntries(&mut columns).visit_seq(seq)?;
                Ok(columns)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                packed::read_logprobs(map)
            }
        }
        deserializer.deserialize_any(Either)
    }
}

/// An array of entries, each read onto the end of the columns.
struct AppendEntries<'c>(&'c mut CompletionLogprobs);

impl<'de> Visitor<'de> for AppendEntries<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of logprob entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut scratch = Scratch::default();
        while seq
            .next_element_seed(EntryInto {
                columns: self.0,
                scratch: &mut scratch,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// What reading one entry reuses from the one before: its bytes' buffer.
#[derive(Default)]
struct Scratch {
    bytes: Vec<u8>,
}

/// One entry of the array form, read straight onto the columns: its text borrowed where it has
/// no escapes, its bytes into a reused buffer, so a token costs no heap object of its own.
struct EntryInto<'c> {
    columns: &'c mut CompletionLogprobs,
    scratch: &'c mut Scratch,
}

impl<'de> DeserializeSeed<'de> for EntryInto<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntryInto<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a logprob entry: {\"token\", \"logprob\", \"bytes\", \"top_logprobs\"}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        #[derive(Deserialize)]
        struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

        let mut token: Option<Text<'de>> = None;
        let mut logprob: Option<f64> = None;
        let mut has_bytes = false;
        let mut top_logprobs = Vec::new();
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match &*key.0 {
                "token" => token = Some(map.next_value()?),
                "logprob" => logprob = Some(map.next_value()?),
                "bytes" => {
                    self.scratch.bytes.clear();
                    has_bytes = map.next_value_seed(BytesInto(&mut self.scratch.bytes))?;
                }
                "top_logprobs" => {
                    top_logprobs = map.next_value::<Option<_>>()?.unwrap_or_default();
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let token = token.ok_or_else(|| de::Error::missing_field("token"))?;
        let logprob = logprob.ok_or_else(|| de::Error::missing_field("logprob"))?;
        let bytes = has_bytes.then_some(self.scratch.bytes.as_slice());
        self.columns.push(&token.0, logprob, bytes, top_logprobs);
        Ok(())
    }
}

/// A `bytes` array (or `null`) appended to a buffer; `true` when it was an array.
struct BytesInto<'b>(&'b mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for BytesInto<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BytesInto<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token's bytes: an array of u8, or null")
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_none<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while let Some(byte) = seq.next_element::<u8>()? {
            self.0.push(byte);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn entry(token: &str, logprob: f64, bytes: Option<&[u8]>, top: &[&str]) -> TokenLogprob {
        TokenLogprob {
            token: token.into(),
            logprob,
            bytes: bytes.map(<[u8]>::to_vec),
            top_logprobs: top
                .iter()
                .map(|t| TopLogprob {
                    token: (*t).into(),
                    logprob: -2.0,
                    bytes: None,
                })
                .collect(),
        }
    }

    fn entries() -> Vec<TokenLogprob> {
        vec![
            entry("Hé", -0.5, Some("Hé".as_bytes()), &[]),
            entry("bytes:\\xe2", -9999.0, Some(&[0xe2]), &["x", "y"]),
            entry("", -1.25, None, &[]),
            entry(" there", -0.0, Some(b" there"), &[]),
        ]
    }

    #[test]
    fn the_columns_give_back_every_entry_as_it_was_pushed() {
        let columns = CompletionLogprobs::from(entries());
        assert_eq!(columns.len(), 4);
        let back: Vec<TokenLogprob> = columns.iter().map(|e| e.to_entry()).collect();
        assert_eq!(back, entries());
        assert_eq!(columns.logprobs(), &[-0.5, -9999.0, -1.25, -0.0]);
        assert!(columns.get(4).is_none());
    }

    #[test]
    fn the_array_form_is_the_entries_json_and_reads_back_into_the_same_columns() {
        let columns = CompletionLogprobs::from(entries());
        let plain = serde_json::to_value(&columns).unwrap_or_else(|e| panic!("{e}"));
        let as_entries = serde_json::to_value(entries()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain, as_entries);
        let back: CompletionLogprobs =
            serde_json::from_value(plain).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, columns);
        let text = serde_json::to_string(&columns).unwrap_or_else(|e| panic!("{e}"));
        let back: CompletionLogprobs =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, columns);
    }

    #[test]
    fn an_engines_entry_reads_with_nulls_and_fields_the_schema_does_not_keep() {
        let engine = json!([
            {"token": "a\"b", "logprob": -0.1, "bytes": [97, 34, 98], "top_logprobs": null,
             "rank": 1},
            {"token": "c", "logprob": -0.2, "bytes": null},
        ]);
        let columns: CompletionLogprobs =
            serde_json::from_str(&engine.to_string()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(columns.get(0).map(|e| e.token), Some("a\"b"));
        assert_eq!(columns.get(0).and_then(|e| e.bytes), Some(&b"a\"b"[..]));
        assert_eq!(columns.get(1).and_then(|e| e.bytes), None);
        assert!(!columns.bytes_are_the_text());
        let missing = json!([{"token": "a"}]);
        let err = serde_json::from_value::<CompletionLogprobs>(missing).err();
        assert!(format!("{err:?}").contains("logprob"), "{err:?}");
        let wrong = json!([{"token": "a", "logprob": null}]);
        assert!(serde_json::from_value::<CompletionLogprobs>(wrong).is_err());
    }

    #[test]
    fn entries_read_onto_the_end_or_not_at_all() {
        let all = entries();
        let mut columns = CompletionLogprobs::from(all[..2].to_vec());
        let rest = serde_json::to_string(&all[2..]).unwrap_or_else(|e| panic!("{e}"));
        let mut de = serde_json::Deserializer::from_str(&rest);
        columns
            .append_from(&mut de)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(columns, CompletionLogprobs::from(all.clone()));
        let half_bad = r#"[{"token": "ok", "logprob": -1.0}, {"token": "bad"}]"#;
        let mut de = serde_json::Deserializer::from_str(half_bad);
        assert!(columns.append_from(&mut de).is_err());
        assert_eq!(columns, CompletionLogprobs::from(all));
    }

    #[test]
    fn appending_and_truncating_keep_each_column_in_step() {
        let all = entries();
        let mut columns = CompletionLogprobs::from(all[..1].to_vec());
        columns.append(CompletionLogprobs::from(all[1..3].to_vec()));
        columns.append(CompletionLogprobs::from(all[3..].to_vec()));
        assert_eq!(columns, CompletionLogprobs::from(all.clone()));
        columns.truncate(1);
        assert_eq!(columns, CompletionLogprobs::from(all[..1].to_vec()));
        assert!(!columns.has_alternatives());
        columns.truncate(0);
        assert!(columns.is_empty());
    }
}
