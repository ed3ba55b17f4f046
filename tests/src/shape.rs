//! The shape of an engine's answer, values aside: what a mock must match the real engine on. An
//! object is its keys in order with their shapes, an array the shape of its first element, a
//! scalar its JSON type — so an explicit `null` differs from a missing key and from a string.

use serde_json::{json, Map, Value};

/// The shape of one JSON value. An array's shape merges its elements' (an empty `bytes` list
/// and a full one are the same shape); the completions API's `top_logprobs` maps, keyed by token
/// text, are `{"<token>": "number"}`.
pub fn of(value: &Value) -> Value {
    of_under("", value)
}

fn of_under(key: &str, value: &Value) -> Value {
    match value {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
        Value::Array(items) if key == "top_logprobs" && items.iter().all(is_token_map) => {
            json!([{"<token>": "number"}])
        }
        Value::Array(items) => items
            .iter()
            .map(|item| of_under("", item))
            .reduce(merge)
            .map_or_else(|| json!([]), |merged| json!([merged])),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), of_under(k, v)))
                .collect::<Map<_, _>>(),
        ),
    }
}

/// `{"<token text>": logprob, ...}`.
fn is_token_map(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.values().all(Value::is_number))
}

/// Two element shapes as one: objects take the union of their keys (first seen first), an
/// empty array takes the other's shape; otherwise the first wins.
fn merge(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Object(a), Value::Object(mut b)) => {
            let mut out = Map::new();
            for (k, v) in a {
                let merged = match b.get(&k) {
                    Some(other) => merge(v, other.clone()),
                    None => v,
                };
                out.insert(k, merged);
            }
            for (k, v) in std::mem::take(&mut b) {
                if !out.contains_key(&k) {
                    out.insert(k, v);
                }
            }
            Value::Object(out)
        }
        (Value::Array(a), Value::Array(b)) => match (a.into_iter().next(), b.into_iter().next()) {
            (Some(x), Some(y)) => json!([merge(x, y)]),
            (Some(x), None) | (None, Some(x)) => json!([x]),
            (None, None) => json!([]),
        },
        (a, _) => a,
    }
}

/// Whether two shapes agree: the same keys in the same order, compatible values; an empty
/// array agrees with any array (a list that happened to be empty says nothing of its items).
pub fn compatible(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|((ka, va), (kb, vb))| ka == kb && compatible(va, vb))
        }
        (Value::Array(x), Value::Array(y)) => match (x.first(), y.first()) {
            (Some(p), Some(q)) => compatible(p, q),
            _ => true,
        },
        _ => a == b,
    }
}

/// The kinds of event of an SSE body's `data:` lines: each event's shape, merged into an
/// earlier compatible one (how many content chunks a model writes is not a shape), in the
/// order each kind first appears.
pub fn of_stream(body: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let shape = match serde_json::from_str::<Value>(data) {
            Ok(event) => of(&event),
            Err(_) => json!(data),
        };
        match out.iter_mut().find(|kind| compatible(kind, &shape)) {
            Some(kind) => *kind = merge(kind.clone(), shape),
            None => out.push(shape),
        }
    }
    out
}

/// Whether two streams have the same kinds of event: the same first and last kind, and the same
/// kinds in between in any order (where a model holds text back is the model's business, and so
/// is whether the finishing token has text: the finishing chunk's delta is not compared).
pub fn same_stream(a: &[Value], b: &[Value]) -> bool {
    let ends = |s: &[Value]| {
        let finishing = s.len().checked_sub(2).and_then(|i| s.get(i)).map(|c| {
            let mut c = c.clone();
            if let Some(choice) = c.pointer_mut("/choices/0") {
                choice["delta"] = json!("any");
            }
            c
        });
        (s.first().cloned(), finishing)
    };
    let ((af, al), (bf, bl)) = (ends(a), ends(b));
    // Between the first chunk and the finishing one (the last before `[DONE]`).
    let middle = |s: &[Value]| s.get(1..s.len().saturating_sub(2)).unwrap_or(&[]).to_vec();
    let (am, bm) = (middle(a), middle(b));
    let covered = |x: &[Value], y: &[Value]| x.iter().all(|k| y.iter().any(|l| compatible(k, l)));
    a.len() == b.len()
        && af.zip(bf).is_some_and(|(x, y)| compatible(&x, &y))
        && al.zip(bl).is_some_and(|(x, y)| compatible(&x, &y))
        && covered(&am, &bm)
        && covered(&bm, &am)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_and_nulls_keys_and_order_stay() {
        let a = of(
            &json!({"id": "x", "n": 1, "p": null, "c": [{"t": "a", "b": []}, {"t": "b", "b": [1]}]}),
        );
        assert_eq!(
            a,
            json!({"id": "string", "n": "number", "p": "null", "c": [{"t": "string", "b": ["number"]}]})
        );
        assert_eq!(
            of(&json!({"top_logprobs": [{"a": -1.0}, {"b": -2.0}]})),
            json!({"top_logprobs": [{"<token>": "number"}]})
        );
        assert_ne!(a, of(&json!({"n": 1, "id": "x", "p": null, "c": []})));
        let s = of_stream(
            "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: {\"b\":null}\n\ndata: [DONE]\n\n",
        );
        assert_eq!(
            s,
            vec![
                json!({"a": "number"}),
                json!({"b": "null"}),
                json!("[DONE]")
            ]
        );
    }
}
