//! The shape of an engine's answer, values aside: what a mock must match the real engine on. An
//! object is its keys in order with their shapes, an array the shape of its first element, a
//! scalar its JSON type — so an explicit `null` differs from a missing key and from a string.

use serde_json::{json, Map, Value};

/// The shape of one JSON value.
pub fn of(value: &Value) -> Value {
    match value {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
        Value::Array(items) => match items.first() {
            Some(first) => json!([of(first)]),
            None => json!([]),
        },
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), of(v)))
                .collect::<Map<_, _>>(),
        ),
    }
}

/// The shapes of an SSE body's `data:` events, each distinct shape once, in the order it first
/// appears (how many content chunks a model writes is not a shape).
pub fn of_stream(body: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let shape = match serde_json::from_str::<Value>(data) {
            Ok(event) => of(&event),
            Err(_) => json!(data),
        };
        if !out.contains(&shape) {
            out.push(shape);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_and_nulls_keys_and_order_stay() {
        let a = of(&json!({"id": "x", "n": 1, "p": null, "c": [{"t": "a"}, {"t": "b", "u": 1}]}));
        assert_eq!(
            a,
            json!({"id": "string", "n": "number", "p": "null", "c": [{"t": "string"}]})
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
