//! The trajectory viewer (`/ui`) in a real headless Chromium: a tool-using session is recorded
//! through the sidecar against the vLLM-shaped mock engine, scored through the handshake API,
//! and the page must show its turns, tool call, next state, rewards, hint, logprob-shaded tokens
//! and the tenant's live policy. A screenshot is kept under `target/test-artifacts/`.
//!
//! Chromium is Debian's `chromium`, installed by `scripts/test` (`ensure_chromium` in
//! `scripts/lib.sh`); `CLAWBACK_CHROMIUM` overrides its path.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::{
    GateDecision, GateSetScore, PolicyVersion, TenantId, Tokens, TrajectoryRecord,
    TrajectoryStatus, UnixMs, SCHEMA_VERSION,
};
use clawback_tests::harness::{repo_root, scratch_dir, test_config, Sidecar};
use clawback_tests::mock::MockUpstream;
use serde_json::{json, Value};

use crate::support::{client, first_turn, poll, store, tool_result, tools};

const ADMIN: &str = "viewer-admin-secret";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const HINT: &str = "Ask which unit the user wants before calling get_weather.";
/// Why the scene's trainer held version 5 back.
const HELD_BACK: &str = "retention: 7 of 40 passed, the live version (v3) 24: more than 2 fewer";

/// What the trainer's gate decided about one of the default tenant's candidates.
fn gate_decision(version: u64, live: Option<u64>, candidate: u32) -> GateDecision {
    let promoted = candidate >= 24;
    GateDecision {
        schema_version: SCHEMA_VERSION,
        tenant: default_tenant(),
        version,
        live,
        promoted,
        reasons: if promoted {
            Vec::new()
        } else {
            vec![HELD_BACK.to_owned()]
        },
        sets: vec![GateSetScore {
            name: "retention".to_owned(),
            prompts: 40,
            candidate,
            live: 24,
            base: 26,
        }],
        kl: 0.0123,
        seconds: 41.0,
        decided_at: UnixMs::now(),
    }
}

fn default_tenant() -> TenantId {
    TenantId::new("default").expect("valid tenant")
}

/// One non-streamed chat call of session `session`; returns the assistant message.
async fn chat(sidecar: &Sidecar, session: &str, done: bool, messages: &[Value]) -> Value {
    let mut request = client()
        .post(sidecar.url("/v1/chat/completions"))
        .header("x-clawback-session", session)
        .header("traceparent", TRACEPARENT);
    if done {
        request = request.header("x-clawback-done", "true");
    }
    let response = request
        .json(&json!({"model": "mock-llama", "messages": messages, "tools": tools()}))
        .send()
        .await
        .expect("the sidecar answers");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("a JSON completion");
    body["choices"][0]["message"].clone()
}

/// Records a two-turn tool-using session and returns it once it is stored completed.
async fn record_tool_session(sidecar: &Sidecar, session: &str) -> TrajectoryRecord {
    let mut messages = first_turn();
    let reply = chat(sidecar, session, false, &messages).await;
    let call_id = reply["tool_calls"][0]["id"]
        .as_str()
        .expect("the model called the tool")
        .to_owned();
    messages.push(reply);
    messages.push(tool_result(&call_id));
    chat(sidecar, session, true, &messages).await;

    let store = store(sidecar);
    poll("the tool session stored completed with two steps", || {
        let store = Arc::clone(&store);
        async move {
            let tenant = default_tenant();
            let headers = store.list_trajectories(&tenant, None, 100).await.ok()?;
            for header in headers {
                let record = store.trajectory(&tenant, &header.id).await.ok()??;
                if record.trajectory.metadata.get("session") == Some(&json!(session))
                    && record.trajectory.status == TrajectoryStatus::Completed
                    && record.steps.len() == 2
                {
                    return Some(record);
                }
            }
            None
        }
    })
    .await
}

fn admin(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    request.bearer_auth(ADMIN)
}

async fn admin_get(sidecar: &Sidecar, path: &str) -> Value {
    let response = admin(client().get(sidecar.url(path)))
        .send()
        .await
        .expect("the sidecar answers");
    assert_eq!(response.status(), 200, "GET {path}");
    response.json().await.expect("a JSON answer")
}

/// A sidecar with the admin API on, a recorded and scored tool session, and a live policy.
struct Scene {
    _engine: MockUpstream,
    sidecar: Sidecar,
    record: TrajectoryRecord,
}

async fn scene() -> Scene {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.admin.token = Some(ADMIN.to_owned());
    let sidecar = Sidecar::start(config).await;
    let recorded = record_tool_session(&sidecar, "weather-paris").await;
    let id = recorded.trajectory.id;

    for feedback in [
        json!({"step": 0, "reward": 1.0, "hint": HINT}),
        json!({"step": 1, "reward": -0.5, "label": "too-terse"}),
    ] {
        let response = admin(client().post(sidecar.url(&format!("/trajectories/{id}/feedback"))))
            .json(&feedback)
            .send()
            .await
            .expect("the sidecar answers");
        assert_eq!(response.status(), 202, "{feedback}");
    }
    let policy = PolicyVersion {
        schema_version: SCHEMA_VERSION,
        tenant: default_tenant(),
        adapter: "default@v3".to_owned(),
        version: 3,
        live_since: UnixMs::now(),
        canary: None,
    };
    store(&sidecar)
        .set_policy_version(&policy)
        .await
        .expect("the policy is stored");
    // The trainer's gate promoted version 3 and held 5 back.
    for decision in [gate_decision(3, None, 25), gate_decision(5, Some(3), 7)] {
        store(&sidecar)
            .record_gate_decision(&decision)
            .await
            .expect("the gate decision is stored");
    }

    let store = store(&sidecar);
    let record = poll("both evaluations stored", || {
        let store = Arc::clone(&store);
        async move {
            let record = store.trajectory(&default_tenant(), &id).await.ok()??;
            (record.evaluations.len() == 2).then_some(record)
        }
    })
    .await;
    Scene {
        _engine: engine,
        sidecar,
        record,
    }
}

#[tokio::test]
async fn the_recorded_step_carries_the_agents_traceparent() {
    let scene = scene().await;
    for step in &scene.record.steps {
        assert_eq!(step.traceparent.as_deref(), Some(TRACEPARENT));
    }
}

#[tokio::test]
async fn the_admin_api_lists_tenants_trajectories_and_rewards_for_the_viewer() {
    let scene = scene().await;
    let sidecar = &scene.sidecar;
    let id = scene.record.trajectory.id.to_string();

    let tenants = admin_get(sidecar, "/tenants").await;
    assert_eq!(
        tenants["tenants"],
        json!([{"tenant": "default", "policy": {
            "adapter": "default@v3", "version": 3,
            "live_since": tenants["tenants"][0]["policy"]["live_since"]}}])
    );

    // A session still talking is listed first (newest), live; the finished one after it.
    chat(sidecar, "still-talking", false, &first_turn()).await;
    let listed = poll("the live session listed", || async {
        let listed = admin_get(sidecar, "/trajectories?tenant=default&limit=10").await;
        (listed["trajectories"].as_array().map(Vec::len) == Some(2)).then_some(listed)
    })
    .await;
    assert_eq!(listed["complete"], true);
    let (newest, finished) = (&listed["trajectories"][0], &listed["trajectories"][1]);
    assert_eq!(newest["metadata"]["session"], "still-talking");
    assert_eq!(
        (&newest["status"], &newest["live"]),
        (&json!("open"), &json!(true))
    );
    assert_eq!(finished["id"], json!(id));
    assert_eq!(
        (&finished["status"], &finished["live"]),
        (&json!("completed"), &json!(false))
    );
    // Each says what the list shows of it: its first user message, its steps, its rewards' mean.
    assert_eq!(
        finished["summary"],
        json!({"first_user_message": "What's the weather in Paris?", "steps": 2,
               "reward": 0.25, "rewards": 2})
    );
    assert_eq!(
        (&newest["summary"]["steps"], &newest["summary"]["reward"]),
        (&json!(1), &Value::Null)
    );

    // A search keeps the trajectories whose conversation has every word, in any case: the tool's
    // answer ("sunny") is in the finished one only.
    let ids = |listed: &Value| -> Vec<Value> {
        listed["trajectories"]
            .as_array()
            .map(|all| all.iter().map(|t| t["id"].clone()).collect())
            .unwrap_or_default()
    };
    let sunny = admin_get(sidecar, "/trajectories?tenant=default&q=SUNNY+paris").await;
    assert_eq!(
        (ids(&sunny), &sunny["searched"]),
        (vec![json!(id)], &json!(2))
    );
    let paris = admin_get(sidecar, "/trajectories?tenant=default&q=%20Paris%20").await;
    assert_eq!(ids(&paris).len(), 2);
    let neither = admin_get(sidecar, "/trajectories?tenant=default&q=sunny+zebra").await;
    assert_eq!(
        (ids(&neither).len(), &neither["complete"]),
        (0, &json!(true))
    );

    let rewards = admin_get(sidecar, "/tenants/default/rewards").await;
    let points = rewards["points"].as_array().expect("points");
    let mut seen: Vec<(f64, u64)> = points
        .iter()
        .map(|p| {
            assert_eq!(p["trajectory"], json!(id));
            (
                p["reward"].as_f64().unwrap_or(f64::NAN),
                p["step_index"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect();
    seen.sort_by_key(|(_, step)| *step);
    assert_eq!(seen, vec![(1.0, 0), (-0.5, 1)]);

    // The gate's decisions on the tenant's candidates, newest first, with why one was held back.
    let gate = admin_get(sidecar, "/tenants/default/gate").await;
    let decisions: Vec<GateDecision> =
        serde_json::from_value(gate["decisions"].clone()).expect("gate decisions");
    let shown: Vec<(u64, bool, Vec<String>)> = decisions
        .into_iter()
        .map(|d| (d.version, d.promoted, d.reasons))
        .collect();
    assert_eq!(
        shown,
        vec![
            (5, false, vec![HELD_BACK.to_owned()]),
            (3, true, Vec::new())
        ]
    );
    let newest = admin_get(sidecar, "/tenants/default/gate?limit=1").await;
    assert_eq!(newest["decisions"].as_array().map(Vec::len), Some(1));

    // Every view needs the admin token, and a limit is a number within bounds.
    for path in [
        "/tenants",
        "/trajectories",
        "/tenants/default/rewards",
        "/tenants/default/gate",
    ] {
        let refused = client()
            .get(sidecar.url(path))
            .send()
            .await
            .expect("answer");
        assert_eq!(refused.status(), 401, "{path}");
    }
    let bad = admin(client().get(sidecar.url("/trajectories?limit=0")))
        .send()
        .await
        .expect("answer");
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn the_viewer_files_are_served_self_contained_and_only_with_an_admin_token_configured() {
    let scene = scene().await;
    let page = client()
        .get(scene.sidecar.url("/ui"))
        .send()
        .await
        .expect("answer");
    assert_eq!(page.status(), 200);
    let csp = page
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(page.text().await.expect("a page").contains("/ui/app.js"));
    for (path, kind) in [
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        let file = client()
            .get(scene.sidecar.url(path))
            .send()
            .await
            .expect("answer");
        assert_eq!(file.status(), 200, "{path}");
        let content_type = file.headers()[http::header::CONTENT_TYPE]
            .to_str()
            .unwrap_or_default();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
    }

    let engine = MockUpstream::start().await;
    let no_admin = Sidecar::start(test_config(&[engine.url()])).await;
    let off = client()
        .get(no_admin.url("/ui"))
        .send()
        .await
        .expect("answer");
    assert_eq!(off.status(), 404);
}

fn chromium() -> PathBuf {
    std::env::var_os("CLAWBACK_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

fn artifacts_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("test-artifacts")
}

/// Runs headless Chromium on `url` with `extra` arguments; returns its stdout.
async fn headless_chromium(url: &str, extra: &[String]) -> String {
    let binary = chromium();
    assert!(
        binary.exists(),
        "{} missing: run scripts/test, which installs chromium (ensure_chromium)",
        binary.display()
    );
    let profile = scratch_dir("chromium-profile");
    let mut command = tokio::process::Command::new(&binary);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .kill_on_drop(true);
    // A guard against a hung browser, not a performance assertion.
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("chromium finished within two minutes")
        .expect("chromium started");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `(logprob, shade alpha)` of every completion-token span in the dumped DOM.
fn token_shades(dom: &str) -> Vec<(f64, f64)> {
    dom.split("<span class=\"tok")
        .skip(1)
        .map(|span| {
            let span = &span[..span.find("</span>").unwrap_or(span.len())];
            let logprob = between(span, "data-logprob=\"", "\"")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("a token span without data-logprob: {span}"));
            let alpha = between(span, "rgba(226, 87, 36, ", ")")
                .and_then(|v| v.parse().ok())
                .or_else(|| {
                    // Chromium writes a fully opaque colour as rgb(...), a transparent one as 0.
                    span.contains("rgb(226, 87, 36)").then_some(1.0)
                })
                .unwrap_or_else(|| panic!("a token span without its shade: {span}"));
            (logprob, alpha)
        })
        .collect()
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(&text[from..from + len])
}

#[tokio::test]
async fn the_viewer_shows_a_recorded_trajectory_in_headless_chromium() {
    let scene = scene().await;
    let id = scene.record.trajectory.id;
    // The token travels in the fragment: the browser never sends it to the server in the URL.
    let url = scene
        .sidecar
        .url(&format!("/ui#token={ADMIN}&tenant=default&trajectory={id}"));

    let dom = headless_chromium(&url, &["--dump-dom".to_owned()]).await;
    let dir = artifacts_dir();
    std::fs::create_dir_all(&dir).expect("the artifacts directory is writable");
    std::fs::write(dir.join("viewer.html"), &dom).expect("the DOM is kept");

    // The token left the address bar, and the page is signed in.
    assert!(!dom.contains(ADMIN), "the admin token leaked into the DOM");
    assert!(dom.contains(&format!("data-trajectory=\"{id}\"")), "{dom}");
    // Both turns, with the conversation, the tool call and what followed it.
    assert!(dom.contains("data-step-index=\"0\"") && dom.contains("data-step-index=\"1\""));
    assert!(dom.contains("What's the weather in Paris?"), "{dom}");
    assert!(dom.contains("data-tool-call=\"get_weather\""), "{dom}");
    assert!(
        dom.contains("&quot;city&quot;: &quot;Paris&quot;") || dom.contains("\"city\": \"Paris\"")
    );
    let next_state = between(&dom, "<div class=\"next-state\">", "</div></div>")
        .expect("the first turn shows its next state");
    assert!(next_state.contains("data-role=\"tool\""), "{next_state}");
    assert!(
        next_state.contains("{\"temp_c\": 21, \"sky\": \"sunny\"}"),
        "{next_state}"
    );
    assert!(dom.contains(
        clawback_tests::engine_json::ANSWER
            .split(',')
            .next()
            .unwrap_or_default()
    ));
    // The evaluations: both rewards, the hint, the label.
    assert!(dom.contains("data-reward=\"1\""), "{dom}");
    assert!(dom.contains("data-reward=\"-0.5\""), "{dom}");
    assert!(dom.contains(HINT), "{dom}");
    assert!(dom.contains("label=too-terse"), "{dom}");
    // The reward chart draws both, the live policy is shown, the traceparent too.
    assert_eq!(dom.matches("<circle class=\"point ").count(), 2, "{dom}");
    assert!(
        dom.contains("<strong id=\"policy-adapter\">default@v3</strong>"),
        "{dom}"
    );
    assert!(dom.contains("data-version=\"3\""), "{dom}");
    assert!(dom.contains(TRACEPARENT));
    // The list shows the conversation's first user message and the mean of its rewards.
    assert!(
        dom.contains("data-first-message=\"\">What's the weather in Paris?</div>"),
        "{dom}"
    );
    assert!(dom.contains("data-list-reward=\"0.25\""), "{dom}");
    // The gate's decisions: version 5 held back and why, version 3 promoted.
    assert!(
        dom.contains("<tr class=\"held-back\" data-gate-version=\"5\">"),
        "{dom}"
    );
    assert!(
        dom.contains("<tr class=\"promoted\" data-gate-version=\"3\">"),
        "{dom}"
    );
    assert!(dom.contains(HELD_BACK), "{dom}");
    assert!(dom.contains("retention 7/40 (live 24, base 26)"), "{dom}");

    // One shaded span per completion token, and a less likely token is shaded darker.
    let logprobs: usize = scene
        .record
        .steps
        .iter()
        .map(|step| match &step.tokens {
            Tokens::Engine(tokens) => tokens.completion_logprobs.len(),
            Tokens::None => 0,
        })
        .sum();
    let shades = token_shades(&dom);
    assert_eq!(shades.len(), logprobs);
    assert!(logprobs > 0);
    let mut by_logprob = shades.clone();
    by_logprob.sort_by(|a, b| b.0.total_cmp(&a.0));
    for pair in by_logprob.windows(2) {
        assert!(pair[0].1 <= pair[1].1, "shading is not monotonic: {pair:?}");
    }
    assert!(by_logprob.first().map(|s| s.1) < by_logprob.last().map(|s| s.1));

    let screenshot = dir.join("viewer.png");
    let _ = std::fs::remove_file(&screenshot);
    headless_chromium(
        &url,
        &[
            format!("--screenshot={}", screenshot.display()),
            "--window-size=1280,2000".to_owned(),
        ],
    )
    .await;
    assert_is_png(&screenshot);
    println!("viewer screenshot: {}", screenshot.display());
}

#[tokio::test]
async fn the_viewers_search_keeps_the_conversations_with_every_word() {
    let scene = scene().await;
    let id = scene.record.trajectory.id;
    let at = |query: &str| {
        scene
            .sidecar
            .url(&format!("/ui#token={ADMIN}&tenant=default&q={query}"))
    };

    let found = headless_chromium(&at("sunny%20PARIS"), &["--dump-dom".to_owned()]).await;
    assert!(
        found.contains(&format!("data-trajectory=\"{id}\"")),
        "{found}"
    );
    assert!(
        found.contains("(1 matching, of the newest 1 searched)"),
        "{found}"
    );

    let none = headless_chromium(&at("zebra"), &["--dump-dom".to_owned()]).await;
    let list = between(&none, "<ul id=\"trajectories\">", "</ul>").unwrap_or_default();
    assert_eq!(list, "<li class=\"muted\">nothing matches</li>", "{none}");
}

#[tokio::test]
async fn the_viewer_asks_for_the_token_again_when_the_one_it_has_is_refused() {
    let scene = scene().await;
    let url = scene.sidecar.url("/ui#token=not-the-admin-token");

    let dom = headless_chromium(&url, &["--dump-dom".to_owned()]).await;

    assert!(dom.contains("<form id=\"login\" class=\"login\">"), "{dom}");
    assert!(dom.contains("<main id=\"main\" hidden=\"\">"), "{dom}");
    assert!(dom.contains("the admin token was refused"), "{dom}");
    assert!(!dom.contains("What's the weather in Paris?"), "{dom}");
}

fn assert_is_png(path: &Path) {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
    assert!(bytes.len() > 10_000, "the screenshot is nearly empty");
}
