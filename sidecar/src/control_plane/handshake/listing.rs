//! The read-only views the trajectory viewer ([`crate::control_plane::ui`]) polls: every tenant with its live
//! policy, a tenant's newest trajectories, its rewards over time, and the trainer's gate decisions
//! on its candidate versions; and a tenant's export as training rows. A tenant token sees its own
//! tenant only.
//!
//! The stores list trajectories oldest first, so "newest" is found by paging through at most
//! [`MAX_SCANNED`] headers and keeping the tail; a tenant with more says so (`"complete": false`)
//! and the view shows the newest of the ones it scanned. Rewards come from the evaluations of the
//! newest trajectories only, so one poll reads a bounded number of records.

use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::StreamExt;

use clawback_datapool::{
    EvaluationSource, Store, TenantId, Trajectory, TrajectoryId, TrajectoryRecord, UnixMs, Verdict,
    GATE_DECISIONS_KEPT,
};
use http::{request, Response, StatusCode};
use serde::Serialize;
use serde_json::json;

use super::summary::{Search, Summary};
use super::{json_response, named_tenant, query_param, HandshakeError, Scope};
use crate::control_plane::Handles;
use crate::data_plane::body::ProxyBody;

/// The most trajectory headers one listing reads from the store.
const MAX_SCANNED: usize = 10_000;
/// Headers read per store call while scanning.
const PAGE: usize = 500;
/// Trajectories listed when the caller gives no `limit`, and the most it may ask for.
const LIST_DEFAULT: usize = 100;
const LIST_MAX: usize = 1_000;
/// Trajectories whose rewards are read when the caller gives no `limit`, and the most.
const REWARDS_DEFAULT: usize = 50;
const REWARDS_MAX: usize = 200;

/// `limit=N` from the query: `default` when absent, refused when not a number in `1..=max`.
fn limit(parts: &request::Parts, default: usize, max: usize) -> Result<usize, HandshakeError> {
    match query_param(parts, "limit") {
        None => Ok(default),
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| HandshakeError::BadBody(format!("limit must be 1-{max}, not {raw:?}"))),
    }
}

/// The newest `keep` trajectory headers of `tenant`, newest first, and whether the scan reached
/// the end of the tenant's trajectories.
async fn newest(
    store: &dyn Store,
    tenant: &TenantId,
    keep: usize,
) -> Result<(Vec<Trajectory>, bool), HandshakeError> {
    let mut tail: VecDeque<Trajectory> = VecDeque::with_capacity(keep + 1);
    let mut after: Option<TrajectoryId> = None;
    let mut scanned = 0;
    let complete = loop {
        if scanned >= MAX_SCANNED {
            break false;
        }
        let asked = PAGE.min(MAX_SCANNED - scanned);
        let page = store
            .list_trajectories(tenant, after.as_ref(), asked)
            .await?;
        let Some(last) = page.last() else {
            break true;
        };
        after = Some(last.id);
        scanned += page.len();
        let short = page.len() < asked;
        for header in page {
            if tail.len() == keep {
                tail.pop_front();
            }
            tail.push_back(header);
        }
        if short {
            break true;
        }
    };
    Ok((tail.into_iter().rev().collect(), complete))
}

/// `GET /tenants`: every tenant with data (and the default tenant), each with its live policy.
pub(super) async fn tenants(
    control: &Handles,
    scope: &Scope,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    let store = recorder.store();
    let mut tenants = match scope {
        Scope::All => store.tenants().await?,
        Scope::Tenant(own) => vec![own.clone()],
    };
    if let Ok(default) = named_tenant(control, scope, None) {
        if !tenants.contains(&default) {
            tenants.push(default);
        }
    }
    tenants.sort();
    let mut listed = Vec::with_capacity(tenants.len());
    for tenant in tenants {
        let policy = store.policy_version(&tenant).await?;
        listed.push(json!({
            "tenant": tenant.as_str(),
            "policy": policy.map(|p| json!({
                "adapter": p.adapter,
                "version": p.version,
                "live_since": p.live_since,
            })),
        }));
    }
    Ok(json_response(StatusCode::OK, &json!({ "tenants": listed })))
}

/// One trajectory header as listed: the stored header, whether this sidecar holds it live, and
/// what the viewer's list shows of it (read from its record).
#[derive(Serialize)]
struct Listed {
    #[serde(flatten)]
    trajectory: Trajectory,
    live: bool,
    summary: Option<Summary>,
}

/// Records read at once while listing or searching.
const READ_AT_ONCE: usize = 8;
/// The newest trajectories a search reads, at most: with more, it says so (`"complete": false`).
const SEARCH_MAX_READ: usize = 2_000;

/// `GET /trajectories?tenant=T&limit=N&q=words`: the tenant's newest trajectories, newest first,
/// each with its summary; with `q`, only those whose conversation (or id) has every word, among
/// the newest [`SEARCH_MAX_READ`].
pub(super) async fn trajectories(
    control: &Handles,
    scope: &Scope,
    parts: &request::Parts,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    let tenant = named_tenant(control, scope, query_param(parts, "tenant"))?;
    let keep = limit(parts, LIST_DEFAULT, LIST_MAX)?;
    let search = query_param(parts, "q").and_then(|q| Search::new(&q));
    let store = recorder.store();
    let scan = if search.is_some() {
        SEARCH_MAX_READ
    } else {
        keep
    };
    let (headers, reached_end) = newest(store.as_ref(), &tenant, scan).await?;
    let scanned = headers.len();
    let mut records = futures_util::stream::iter(headers)
        .map(|header| {
            let (store, tenant) = (Arc::clone(store), &tenant);
            async move {
                let record = store.trajectory(tenant, &header.id).await;
                (header, record)
            }
        })
        .buffered(READ_AT_ONCE);
    let mut found = Vec::new();
    let mut read = 0;
    while let Some((header, record)) = records.next().await {
        read += 1;
        let record = record?;
        if let Some(search) = &search {
            if !record.as_ref().is_some_and(|r| search.matches(r)) {
                continue;
            }
        }
        found.push((header, record.as_ref().map(Summary::of)));
        if found.len() == keep {
            break;
        }
    }
    // Whether each is live, asked for all at once (one round trip each to a shared store).
    let live = futures_util::future::join_all(
        found
            .iter()
            .map(|(header, _)| recorder.is_live(&tenant, &header.id)),
    )
    .await;
    let listed: Vec<Listed> = found
        .into_iter()
        .zip(live)
        .map(|((trajectory, summary), live)| Listed {
            trajectory,
            live: live.unwrap_or(false),
            summary,
        })
        .collect();
    // A search is complete when it read every trajectory the tenant has.
    let complete = match &search {
        None => reached_end,
        Some(_) => reached_end && scanned < SEARCH_MAX_READ && read == scanned,
    };
    let mut body = json!({
        "tenant": tenant.as_str(),
        "trajectories": listed,
        "complete": complete,
    });
    if search.is_some() {
        body["searched"] = json!(read);
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// One reward, as the chart draws it.
#[derive(Debug, Serialize)]
struct RewardPoint {
    at: UnixMs,
    reward: f64,
    trajectory: TrajectoryId,
    /// The 0-based index of the step judged; `None` for a trajectory-level reward.
    step_index: Option<u32>,
    /// The plugin's name or the feedback channel.
    source: String,
}

/// Every scored reward of `record`.
fn reward_points(record: &TrajectoryRecord) -> impl Iterator<Item = RewardPoint> + '_ {
    record.evaluations.iter().filter_map(move |evaluation| {
        let Verdict::Score {
            reward: Some(reward),
            ..
        } = evaluation.verdict
        else {
            return None;
        };
        let step_index = evaluation
            .step
            .and_then(|step| record.steps.iter().find(|s| s.id == step).map(|s| s.index));
        let source = match &evaluation.source {
            EvaluationSource::Plugin { name, .. } => name.clone(),
            EvaluationSource::Feedback { channel } => channel.clone(),
        };
        Some(RewardPoint {
            at: evaluation.created_at,
            reward,
            trajectory: record.trajectory.id,
            step_index,
            source,
        })
    })
}

/// The recorder's store and the tenant named in the path, as far as the caller's scope reaches.
fn tenant_store<'a>(
    control: &'a Handles,
    scope: &Scope,
    raw_tenant: &str,
) -> Result<(&'a dyn Store, TenantId), HandshakeError> {
    let recorder = control
        .recorder
        .as_ref()
        .ok_or(HandshakeError::RecordingOff)?;
    let tenant = named_tenant(control, scope, Some(raw_tenant.to_owned()))?;
    Ok((recorder.store().as_ref(), tenant))
}

/// `GET /tenants/{tenant}/rewards?limit=N`: the rewards of the tenant's newest `N`
/// trajectories, oldest first.
pub(super) async fn rewards(
    control: &Handles,
    scope: &Scope,
    raw_tenant: &str,
    parts: &request::Parts,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let (store, tenant) = tenant_store(control, scope, raw_tenant)?;
    let keep = limit(parts, REWARDS_DEFAULT, REWARDS_MAX)?;
    let (headers, _) = newest(store, &tenant, keep).await?;
    let mut points = Vec::new();
    for header in &headers {
        if let Some(record) = store.trajectory(&tenant, &header.id).await? {
            points.extend(reward_points(&record));
        }
    }
    points.sort_by_key(|p| p.at);
    let body = json!({
        "tenant": tenant.as_str(),
        "trajectories": headers.len(),
        "points": points,
    });
    Ok(json_response(StatusCode::OK, &body))
}

/// Gate decisions listed when the caller gives no `limit` (the datapool keeps at most
/// `GATE_DECISIONS_KEPT`).
const GATE_DEFAULT: usize = 20;

/// `GET /tenants/{tenant}/gate?limit=N`: what the trainer's gate decided about the tenant's
/// newest candidate versions, newest first: promoted or held back, why, each prompt set's counts
/// against the live version and the base, and the KL to the base.
pub(super) async fn gate(
    control: &Handles,
    scope: &Scope,
    raw_tenant: &str,
    parts: &request::Parts,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let (store, tenant) = tenant_store(control, scope, raw_tenant)?;
    let keep = limit(parts, GATE_DEFAULT, GATE_DECISIONS_KEPT)?;
    let decisions = store.gate_decisions(&tenant, keep).await?;
    let body = json!({
        "tenant": tenant.as_str(),
        "decisions": decisions,
    });
    Ok(json_response(StatusCode::OK, &body))
}

/// Trajectories one export answer holds when the caller gives no `limit`, and the most.
const EXPORT_DEFAULT: usize = 1_000;
const EXPORT_MAX: usize = 10_000;

/// `GET /tenants/{tenant}/export?limit=N&since=T`: the tenant's completed trajectories as
/// training rows (JSONL, as `clawback-sidecar export` writes them), oldest first.
pub(super) async fn export(
    control: &Handles,
    scope: &Scope,
    raw_tenant: &str,
    parts: &request::Parts,
) -> Result<Response<ProxyBody>, HandshakeError> {
    let (store, tenant) = tenant_store(control, scope, raw_tenant)?;
    let since = query_param(parts, "since")
        .map(|raw| crate::control_plane::export::parse_since(&raw).map_err(HandshakeError::BadBody))
        .transpose()?;
    let options = crate::control_plane::export::Options {
        tenant,
        format: crate::control_plane::export::Format::Jsonl,
        out: None,
        since,
        limit: Some(limit(parts, EXPORT_DEFAULT, EXPORT_MAX)?),
    };
    let (rows, summary) = crate::control_plane::export::to_jsonl(store, &options)
        .await
        .map_err(|e| HandshakeError::Export(e.to_string()))?;
    let mut response = Response::new(ProxyBody::full(rows));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    if let Ok(value) = http::HeaderValue::try_from(summary.to_string()) {
        headers.insert("x-clawback-export", value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use clawback_datapool::LocalStore;

    use super::*;

    #[tokio::test]
    async fn the_newest_trajectories_are_found_across_pages_newest_first() {
        let dir = std::env::temp_dir().join(format!("clawback-listing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let store = LocalStore::open(dir.join("store.sqlite3")).unwrap_or_else(|e| panic!("{e}"));
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        let mut ids = Vec::new();
        for _ in 0..(2 * PAGE + 3) {
            let trajectory = Trajectory::open(tenant.clone(), TrajectoryId::new());
            ids.push(trajectory.id);
            store
                .upsert_trajectory(&trajectory)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }

        let (newest, complete) = newest(&store, &tenant, 4)
            .await
            .unwrap_or_else(|e| panic!("{e}"));

        let listed: Vec<TrajectoryId> = newest.iter().map(|t| t.id).collect();
        let expected: Vec<TrajectoryId> = ids.iter().rev().take(4).copied().collect();
        assert_eq!(listed, expected);
        assert!(complete);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
