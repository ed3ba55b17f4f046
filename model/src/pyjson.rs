//! Python's `json.dumps` for template values, because chat templates print tool schemas
//! and tool-call arguments with `tojson` and the model was trained on Python's spelling:
//! `", "` and `": "` separators, insertion-ordered keys, non-ASCII kept, floats as `repr`.
//! minijinja's own `tojson` is compact and HTML-escapes, which would change the prompt.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The knobs transformers' `tojson` filter exposes.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            indent: None,
            item_separator: ", ".to_owned(),
            key_separator: ": ".to_owned(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

impl DumpOptions {
    /// Python switches the item separator to "," when an indent is given.
    pub fn with_indent(indent: String) -> Self {
        DumpOptions {
            indent: Some(indent),
            item_separator: ",".to_owned(),
            ..Self::default()
        }
    }
}

/// Serialises `value` as `json.dumps(value, ...)` would.
pub fn dumps(value: &Value, options: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, v: &Value, o: &DumpOptions, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            // `as_i64` also accepts integral floats, which Python prints as `1.0`.
            if let (true, Some(i)) = (v.is_integer(), v.as_i64()) {
                let _ = write!(out, "{i}");
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&float_repr(f));
            }
        }
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, o, depth, '[', ']', &items, |out, item, depth| {
                write_value(out, item, o, depth)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort();
            }
            write_container(out, o, depth, '{', '}', &keys, |out, key, depth| {
                let key_text = match key.as_str() {
                    Some(s) => s.to_owned(),
                    None => key.to_string(),
                };
                write_string(out, &key_text, o.ensure_ascii);
                out.push_str(&o.key_separator);
                write_value(out, &v.get_item(key)?, o, depth)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot serialise a {} value", v.kind()),
            ))
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    o: &DumpOptions,
    depth: usize,
    open: char,
    close: char,
    items: &[Value],
    mut write_item: impl FnMut(&mut String, &Value, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&o.item_separator);
        }
        if let Some(indent) = &o.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        write_item(out, item, depth + 1)?;
    }
    if let Some(indent) = &o.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-tripping digits, in positional notation for
/// exponents -4..16 (`0.0001`, `1e-05`, `1e+16`), always with a `.0` when integral.
fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // `{:e}` gives the shortest round-trip mantissa, e.g. "1.5e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{f}");
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(json: &str) -> String {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        dumps(
            &Value::from(minijinja::value::Serde(&v)),
            &DumpOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn objects_keep_their_order_and_python_separators() {
        assert_eq!(
            dump(r#"{"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2]}}"#),
            r#"{"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2]}}"#
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        assert_eq!(float_repr(1.0), "1.0");
        assert_eq!(float_repr(0.1), "0.1");
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(float_repr(1.5e16), "1.5e+16");
        assert_eq!(float_repr(-2.5), "-2.5");
        assert_eq!(float_repr(123456789.0), "123456789.0");
    }

    #[test]
    fn strings_escape_quotes_and_controls_but_not_unicode() {
        assert_eq!(dump(r#""a\"b\\c\nd\u0001é""#), r#""a\"b\\c\nd\u0001é""#);
        let ascii = DumpOptions {
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        assert_eq!(
            dumps(&Value::from("é😀"), &ascii).unwrap(),
            r#""\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn indent_switches_to_multiline_with_comma_separator() {
        let v: serde_json::Value = serde_json::from_str(r#"{"a": [1, {}], "b": []}"#).unwrap();
        let out = dumps(
            &Value::from(minijinja::value::Serde(&v)),
            &DumpOptions::with_indent("  ".into()),
        )
        .unwrap();
        assert_eq!(out, "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    }
}
