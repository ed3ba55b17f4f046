//! The sidecar's configuration reference, rendered from the configuration's JSON Schema
//! (`schemars`, from the types the loader deserialises, their doc comments included) and its
//! defaults (`Config::default()`, as the loader starts from them): one table per section, every
//! key with its type, default and meaning.

use clawback_sidecar::config::Config;
use serde_json::Value;

/// The reference's generated part, in Markdown.
pub fn render() -> String {
    let schema = serde_json::to_value(clawback_sidecar::config::schema())
        .unwrap_or_else(|e| panic!("the configuration's schema: {e}"));
    let defaults = serde_json::to_value(Config::default())
        .unwrap_or_else(|e| panic!("the default configuration: {e}"));
    let renderer = Renderer {
        defs: schema.get("$defs").cloned().unwrap_or(Value::Null),
    };
    let mut out = Section::default();
    renderer.section(&mut out, "", "", "", &schema, Some(&defaults));
    let undocumented: Vec<&String> = out.undocumented.iter().collect();
    assert!(
        undocumented.is_empty(),
        "these settings have no doc comment to say what they mean: {undocumented:?}"
    );
    out.text
}

#[derive(Default)]
struct Section {
    text: String,
    undocumented: Vec<String>,
}

struct Renderer {
    defs: Value,
}

impl Renderer {
    /// `schema` with a `$ref` to `#/$defs/...` followed.
    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let name = reference.trim_start_matches("#/$defs/");
                self.defs
                    .get(name)
                    .unwrap_or_else(|| panic!("the schema refers to {reference}, not defined"))
            }
            None => schema,
        }
    }

    /// The struct a property holds, when it is a section rather than a key: itself, the
    /// struct inside an `Option`, the items of a list of tables or the values of a map of
    /// tables — with how its heading is written.
    fn table_of<'a>(&'a self, schema: &'a Value) -> Option<(&'a Value, Nesting)> {
        let resolved = self.resolve(schema);
        if resolved.get("properties").is_some() {
            return Some((resolved, Nesting::Table));
        }
        if let Some(variants) = resolved.get("anyOf").and_then(Value::as_array) {
            let mut tables = variants
                .iter()
                .filter(|v| v.get("type").and_then(Value::as_str) != Some("null"))
                .filter_map(|v| self.table_of(v));
            let one = tables.next();
            if tables.next().is_none() && variants.len() == 2 {
                return one.map(|(t, _)| (t, Nesting::Optional));
            }
        }
        if let Some(items) = resolved.get("items") {
            let items = self.resolve(items);
            if items.get("properties").is_some() {
                return Some((items, Nesting::List));
            }
        }
        if let Some(values) = resolved.get("additionalProperties") {
            let values = self.resolve(values);
            if values.get("properties").is_some() {
                return Some((values, Nesting::Map));
            }
        }
        None
    }

    fn section(
        &self,
        out: &mut Section,
        path: &str,
        heading: &str,
        note: &str,
        schema: &Value,
        defaults: Option<&Value>,
    ) {
        let schema = self.resolve(schema);
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return;
        };
        if !heading.is_empty() {
            out.text.push_str(&format!("### `{heading}`\n\n"));
            if !note.is_empty() {
                out.text.push_str(&format!("{note}\n\n"));
            }
            if let Some(about) = schema.get("description").and_then(Value::as_str) {
                out.text.push_str(&format!("{}\n\n", prose(about)));
            }
        }
        let mut sections = Vec::new();
        let mut rows = String::new();
        for (key, property) in properties {
            let key_path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let default = defaults.and_then(|d| d.get(key));
            if let Some((table, nesting)) = self.table_of(property) {
                let heading = match nesting {
                    Nesting::Table | Nesting::Optional => format!("[{key_path}]"),
                    Nesting::List => format!("[[{key_path}]]"),
                    Nesting::Map => format!("[{key_path}.<name>]"),
                };
                let defaults = match nesting {
                    Nesting::Table | Nesting::Optional => default,
                    Nesting::List | Nesting::Map => None,
                };
                sections.push((key_path, heading, property, table, nesting, defaults));
                continue;
            }
            let meaning = self.meaning(property);
            if meaning.is_empty() {
                out.undocumented.push(key_path.clone());
            }
            rows.push_str(&format!(
                "| `{key}` | {} | {} | {} |\n",
                self.type_name(property),
                default_text(default),
                cell(&meaning)
            ));
        }
        if !rows.is_empty() {
            out.text
                .push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
            out.text.push_str(&rows);
            out.text.push('\n');
        }
        for (key_path, heading, property, table, nesting, defaults) in sections {
            // The field's own doc comment says what the section is for, beside its type's.
            let mut note: Vec<String> = property
                .get("description")
                .and_then(Value::as_str)
                .map(prose)
                .into_iter()
                .collect();
            note.extend(
                match nesting {
                    Nesting::Optional => Some("Optional: unset unless the file has this section."),
                    Nesting::List => Some("A list: each `[[...]]` table is one entry."),
                    Nesting::Map => Some("One table per name."),
                    Nesting::Table => None,
                }
                .map(str::to_owned),
            );
            self.section(out, &key_path, &heading, &note.join(" "), table, defaults);
        }
    }

    /// A key's meaning: its field's doc comment, else its type's.
    fn meaning(&self, property: &Value) -> String {
        property
            .get("description")
            .or_else(|| self.resolve(property).get("description"))
            .and_then(Value::as_str)
            .map(prose)
            .unwrap_or_default()
    }

    fn type_name(&self, schema: &Value) -> String {
        let schema = self.resolve(schema);
        if let Some(value) = schema.get("const") {
            return words(std::iter::once(value));
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            return words(values.iter());
        }
        for alternatives in ["oneOf", "anyOf"] {
            if let Some(variants) = schema.get(alternatives).and_then(Value::as_array) {
                let variants: Vec<&Value> = variants.iter().map(|v| self.resolve(v)).collect();
                if variants.iter().all(|v| v.get("const").is_some()) {
                    return words(variants.iter().filter_map(|v| v.get("const")));
                }
                let (nulls, others): (Vec<&Value>, Vec<&Value>) = variants
                    .iter()
                    .partition(|v| v.get("type").and_then(Value::as_str) == Some("null"));
                let names: Vec<String> = others.iter().map(|v| self.type_name(v)).collect();
                let optional = if nulls.is_empty() { "" } else { ", optional" };
                return format!("{}{optional}", names.join(" or "));
            }
        }
        match schema.get("type") {
            Some(Value::Array(types)) => {
                let optional = types.iter().any(|t| t == "null");
                let named: Vec<String> = types
                    .iter()
                    .filter(|t| *t != "null")
                    .filter_map(Value::as_str)
                    .map(|t| self.one_type(t, schema))
                    .collect();
                let optional = if optional { ", optional" } else { "" };
                format!("{}{optional}", named.join(" or "))
            }
            Some(Value::String(t)) => self.one_type(t, schema),
            _ => "any".to_owned(),
        }
    }

    fn one_type(&self, name: &str, schema: &Value) -> String {
        match name {
            "string" if schema.get("format").and_then(Value::as_str) == Some("duration") => {
                "duration".to_owned()
            }
            "array" => match schema.get("items") {
                Some(items) => format!("list of {}", self.type_name(items)),
                None => "list".to_owned(),
            },
            "object" => match schema.get("additionalProperties") {
                Some(Value::Bool(true)) | None => "table".to_owned(),
                Some(values) => format!("table of {}", self.type_name(values)),
            },
            other => other.to_owned(),
        }
    }
}

#[derive(Clone, Copy)]
enum Nesting {
    Table,
    Optional,
    List,
    Map,
}

/// `"a"` \| `"b"`: the values a key takes.
fn words<'a>(values: impl Iterator<Item = &'a Value>) -> String {
    values
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(" \\| ")
}

fn default_text(default: Option<&Value>) -> String {
    match default {
        None | Some(Value::Null) => "unset".to_owned(),
        Some(value) => cell(&format!("`{value}`")),
    }
}

/// A doc comment as one paragraph of Markdown: lines joined, rustdoc's links as code.
fn prose(doc: &str) -> String {
    let joined = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    joined.replace("[`", "`").replace("`]", "`")
}

/// Text that may sit in a table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}
