//! The HTTP routes page against the sidecar's router: every documented method and path is the
//! route the page says it is.

use clawback_sidecar::control_plane;

/// Each row of the page's tables: method, path, the `route` label it names.
pub fn documented(page: &str) -> Vec<(String, String, String)> {
    page.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // | method | `path` | `label` | what |
            match cells.as_slice() {
                ["", method, path, label, _, ""]
                    if ["GET", "POST", "DELETE", "PUT"].contains(method) =>
                {
                    Some((
                        (*method).to_owned(),
                        path.trim_matches('`').to_owned(),
                        label.trim_matches('`').to_owned(),
                    ))
                }
                _ => None,
            }
        })
        .collect()
}

/// A concrete path for a documented one: each `{placeholder}` filled in.
pub fn concrete(path: &str) -> String {
    path.replace("{anything else}", "files")
        .replace("{session}", "session-1")
        .replace("{id}", "0190a0d1-0000-7000-8000-000000000001")
        .replace("{tenant}", "acme")
        .replace("{prompt_uid}", "prompt-1")
        .replace("{uid}", "uid-1")
}

/// Why `method path` is not the route `label`, if it is not.
pub fn mismatch(method: &str, path: &str, label: &str) -> Option<String> {
    let method = http::Method::from_bytes(method.as_bytes()).ok()?;
    let path = concrete(path);
    if let Some(control_plane::Route::Handshake(Err(()))) =
        control_plane::Route::classify(&method, &path, None)
    {
        return Some(format!(
            "{method} {path} is under the handshake API but no route of it"
        ));
    }
    let route = clawback_sidecar::app::classify(&method, &path, None);
    (route.label() != label).then(|| {
        format!(
            "{method} {path}: the page says `{label}`, the router says `{}`",
            route.label()
        )
    })
}
