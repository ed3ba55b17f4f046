//! The metrics reference, rendered from what `/metrics` exports: every metric family the
//! sidecar registers (the filter host's included), with its type and its own help text.

use clawback_sidecar::data_plane::metrics::Metrics;

/// The reference's generated part, in Markdown.
pub fn render() -> String {
    let exported = Metrics::new().render();
    let mut families: Vec<(String, String, String)> = Vec::new();
    for line in exported.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push((name.to_owned(), String::new(), help.to_owned()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some(family) = families.iter_mut().find(|f| f.0 == name) {
                family.1 = kind.to_owned();
            }
        }
    }
    assert!(
        families.len() > 20,
        "/metrics exported {} families:\n{exported}",
        families.len()
    );
    let undocumented: Vec<&str> = families
        .iter()
        .filter(|f| f.2.trim().is_empty())
        .map(|f| f.0.as_str())
        .collect();
    assert!(
        undocumented.is_empty(),
        "metrics with no help text: {undocumented:?}"
    );
    let mut out = String::from("| metric | type | what it counts |\n|---|---|---|\n");
    for (name, kind, help) in families {
        // What a query names: a counter's samples end in `_total`, a histogram's in
        // `_bucket`, `_sum` and `_count`.
        let queried = match kind.as_str() {
            "counter" => format!("`{name}_total`"),
            "histogram" => format!("`{name}_bucket`, `_sum`, `_count`"),
            _ => format!("`{name}`"),
        };
        let help = help.trim_end_matches('.').replace('|', "\\|");
        out.push_str(&format!("| {queried} | {kind} | {help}. |\n"));
    }
    out
}
