//! The Grafana dashboard cannot rot: every metric its queries name is one the sidecar's
//! `/metrics` exports, with the suffix its type gives (`_total` of a counter; `_bucket`, `_sum`,
//! `_count` of a histogram; the bare name of a gauge).

use std::collections::BTreeMap;

use clawback_tests::harness::{repo_root, test_config, Sidecar};
use clawback_tests::mock::MockUpstream;
use serde_json::Value;

/// Metric family name → type, from the `# TYPE` lines of a Prometheus text exposition. Families
/// are listed even before they have a sample, so an idle sidecar shows them all.
fn families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// Every `expr` in the dashboard, panels inside rows included.
fn queries(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("expr", Value::String(expr)) => found.push(expr.clone()),
                    _ => queries(inner, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| queries(item, found)),
        _ => {}
    }
}

/// The `clawback_*` metric names a PromQL expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(offset) = expr[i..].find("clawback_") {
        let start = i + offset;
        let preceded_by_word =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(expr.len(), |n| start + n);
        if !preceded_by_word {
            names.push(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// The family a sample name belongs to, if `families` has it with a type that gives that name.
fn family_of<'a>(name: &str, families: &'a BTreeMap<String, String>) -> Option<&'a str> {
    let candidates = [
        (name.strip_suffix("_total"), "counter"),
        (name.strip_suffix("_bucket"), "histogram"),
        (name.strip_suffix("_sum"), "histogram"),
        (name.strip_suffix("_count"), "histogram"),
        (Some(name), "gauge"),
    ];
    candidates.into_iter().find_map(|(base, kind)| {
        let base = base?;
        families
            .get_key_value(base)
            .filter(|(_, t)| t.as_str() == kind)
            .map(|(k, _)| k.as_str())
    })
}

/// The trainer's families (`clawback_trainer_*`), read from the source that registers them: the
/// trainer links libtorch, so this suite cannot start one. Each `registry.register("name", "help",
/// p.field.clone())` names a field of `Prom` whose declared type says counter or gauge.
fn trainer_families() -> BTreeMap<String, String> {
    let path = repo_root().join("trainer/src/train/metrics.rs");
    let source = std::fs::read_to_string(&path).expect("trainer/src/train/metrics.rs");
    let mut kinds = BTreeMap::new();
    for line in source.lines() {
        let Some((field, ty)) = line.trim().split_once(": Family<") else {
            continue;
        };
        let kind = if ty.contains("Counter") {
            "counter"
        } else {
            "gauge"
        };
        kinds.insert(field.to_owned(), kind);
    }
    let flat: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut families = BTreeMap::new();
    for call in flat.split("registry.register(").skip(1) {
        let mut quoted = call.split('"');
        let name = quoted.nth(1).unwrap_or_default();
        let Some(field) = call
            .split("p.")
            .nth(1)
            .and_then(|rest| rest.split(".clone()").next())
        else {
            continue;
        };
        if let Some(kind) = kinds.get(field) {
            families.insert(format!("clawback_trainer_{name}"), (*kind).to_owned());
        }
    }
    assert!(
        families.len() >= 10,
        "found only {families:?} in {}",
        path.display()
    );
    families
}

fn dashboard() -> Value {
    let path = repo_root().join("deploy/grafana/clawback.json");
    let text = std::fs::read_to_string(&path).expect("deploy/grafana/clawback.json");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    let exposition = reqwest::get(sidecar.url("/metrics"))
        .await
        .expect("the sidecar answers")
        .text()
        .await
        .expect("metrics text");
    let sidecar_families = families(&exposition);
    assert!(sidecar_families.len() >= 10, "{exposition}");
    let mut exported = sidecar_families;
    exported.extend(trainer_families());

    let mut exprs = Vec::new();
    queries(&dashboard(), &mut exprs);
    assert!(
        exprs.len() >= 10,
        "the dashboard has {} queries",
        exprs.len()
    );
    let mut used = std::collections::BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "a query of no clawback metric: {expr}");
        for name in names {
            let family = family_of(&name, &exported).unwrap_or_else(|| {
                panic!("the dashboard queries {name}, which /metrics does not export:\n{expr}")
            });
            used.insert(family.to_owned());
        }
    }
    // The reverse direction, as a reminder rather than a rule: every family has a panel.
    let unused: Vec<&String> = exported.keys().filter(|f| !used.contains(*f)).collect();
    assert!(
        unused.is_empty(),
        "metrics without a panel in deploy/grafana/clawback.json: {unused:?}"
    );
}

#[test]
fn the_dashboard_is_importable() {
    let dashboard = dashboard();
    assert!(dashboard["title"].is_string());
    assert!(dashboard["uid"].is_string());
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating variables");
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "panels pick their Prometheus through a datasource variable"
    );
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids: Vec<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has an id");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        assert!(panel["gridPos"]["w"].as_u64().is_some_and(|w| w <= 24));
    }
}

#[test]
fn metric_names_are_read_out_of_promql() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(clawback_added_latency_seconds_bucket[5m]))) \
             / on() group_left sum(clawback_in_flight_requests)"
        ),
        [
            "clawback_added_latency_seconds_bucket",
            "clawback_in_flight_requests"
        ]
    );
    assert!(metric_names("rate(my_clawback_x_total[1m])").is_empty());
}

/// The lag panel's numbers: a trainer group that took one of three ready trajectories shows
/// two not handed out and one pending on the sidecar's /metrics.
#[tokio::test]
async fn a_consumer_groups_lag_shows_on_metrics() {
    use clawback_datapool::{
        Complete, CompletionReason, Consumer, ConsumerName, TenantId, Trajectory, TrajectoryId,
    };
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    let store = sidecar
        .app
        .recorder
        .as_ref()
        .expect("recording is on in the test config")
        .store();
    let tenant = TenantId::new("lag-tenant").expect("tenant id");
    for _ in 0..3 {
        let trajectory = Trajectory::open(tenant.clone(), TrajectoryId::new());
        store.upsert_trajectory(&trajectory).await.expect("upsert");
        store
            .complete_trajectory(&Complete::now(
                tenant.clone(),
                trajectory.id,
                CompletionReason::Handshake,
            ))
            .await
            .expect("complete");
    }
    let trainers = Consumer::new(
        ConsumerName::new("trainers").expect("name"),
        ConsumerName::new("gpu-0").expect("name"),
    );
    let taken = store
        .read_ready(&tenant, &trainers, 1)
        .await
        .expect("read_ready");
    assert_eq!(taken.len(), 1);

    let exposition = reqwest::get(sidecar.url("/metrics"))
        .await
        .expect("the sidecar answers")
        .text()
        .await
        .expect("metrics text");
    for wanted in [
        "clawback_datapool_lag{consumer_group=\"trainers\"} 2",
        "clawback_datapool_pending{consumer_group=\"trainers\"} 1",
    ] {
        assert!(
            exposition.lines().any(|l| l == wanted),
            "no `{wanted}` in:\n{exposition}"
        );
    }
}
