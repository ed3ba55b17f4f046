//! The front doors in `deploy/` — NGINX and Envoy, real binaries — in front of real sidecars:
//! streams pass event by event, headers pass both ways, connections to the sidecars are kept
//! alive, and a session whose calls the door spreads over the sidecars is one trajectory.
//!
//! Streaming is checked without clocks: the mock engine sends the first event and then holds the
//! rest until the test has received that event through the front door. A front door that
//! buffered would never hand it over, and the test fails on its guard instead of passing slowly.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawback_sidecar::config::{Config, UpstreamKind};
use clawback_tests::front_door::{
    envoy_check, envoy_config, nginx_check, start_envoy, start_nginx, FrontDoor,
};
use clawback_tests::harness::{repo_root, scratch_dir, test_config, Sidecar};
use clawback_tests::mock::{Behaviour, Hold, MockUpstream};
use clawback_tests::redis_server::RedisServer;
use futures_util::StreamExt;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

/// Long enough for any machine; only reached when a front door buffers (a failure).
const GUARD: Duration = Duration::from_secs(30);

/// A sidecar that adds nothing to requests, so bodies compare byte for byte.
fn transparent(engine: &MockUpstream) -> Config {
    let mut config = test_config(&[engine.url()]);
    config.upstream_kind = UpstreamKind::Openai;
    config
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client builds")
}

fn chat(stream: bool) -> serde_json::Value {
    json!({
        "model": "mock-llama",
        "messages": [{"role": "user", "content": "Say something about Paris."}],
        "stream": stream
    })
}

#[derive(Clone, Copy)]
enum Door {
    Nginx,
    Envoy,
}

async fn start(door: Door, sidecars: &[SocketAddr]) -> FrontDoor {
    match door {
        Door::Nginx => start_nginx(sidecars).await,
        Door::Envoy => start_envoy(sidecars).await,
    }
}

/// The engine sends one event and holds the rest; the agent must see that event before the
/// engine sends more, then the whole stream, unchanged.
async fn a_stream_passes_event_by_event(door: Door) {
    let engine = MockUpstream::start().await;
    let hold = Hold::after_chunks(1);
    engine.set_behaviour(Behaviour {
        hold: Some(hold.clone()),
        ..Behaviour::default()
    });
    let sidecar = Sidecar::start(transparent(&engine)).await;
    let front = start(door, &[sidecar.addr]).await;

    let response = client()
        .post(front.url("/v1/chat/completions"))
        .json(&chat(true))
        .send()
        .await
        .expect("the front door answers");
    assert_eq!(response.status(), 200, "{}", front.logs());
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();

    let mut received = Vec::new();
    let first_event = tokio::time::timeout(GUARD, async {
        while !received.windows(2).any(|w| w == b"\n\n") {
            match body.next().await {
                Some(chunk) => received.extend_from_slice(&chunk.expect("body chunk")),
                None => break,
            }
        }
    })
    .await;
    assert!(
        first_event.is_ok(),
        "the first event never arrived while the engine held the rest: the front door \
         buffers the stream ({} bytes so far)\n{}",
        received.len(),
        front.logs()
    );
    let sent = engine.sent()[0].clone();
    let first_len = sent
        .windows(2)
        .position(|w| w == b"\n\n")
        .expect("the engine's first event")
        + 2;
    assert_eq!(
        received,
        sent[..first_len],
        "exactly the first event, nothing more"
    );

    hold.release();
    while let Some(chunk) = tokio::time::timeout(GUARD, body.next())
        .await
        .expect("the rest of the stream arrives once released")
    {
        received.extend_from_slice(&chunk.expect("body chunk"));
    }
    assert_eq!(received, sent, "the whole stream, byte for byte");
    assert!(received.ends_with(b"data: [DONE]\n\n"));
}

/// What the agent sends (auth, tracing, SDK headers) reaches the engine; the request id
/// comes back.
async fn headers_pass_both_ways(door: Door) {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;
    let front = start(door, &[sidecar.addr]).await;

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let response = client()
        .post(front.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-agent-key")
        .header("traceparent", traceparent)
        .header("x-stainless-lang", "python")
        .header("x-stainless-retry-count", "0")
        .header("x-request-id", "req-through-the-door")
        .json(&chat(false))
        .send()
        .await
        .expect("the front door answers");
    assert_eq!(response.status(), 200, "{}", front.logs());
    assert_eq!(response.headers()["x-request-id"], "req-through-the-door");
    let body = response.bytes().await.expect("body");
    assert_eq!(body, engine.sent()[0]);

    let received = &engine.received()[0];
    assert_eq!(received.headers["authorization"], "Bearer sk-agent-key");
    assert_eq!(received.headers["traceparent"], traceparent);
    assert_eq!(received.headers["x-stainless-lang"], "python");
    assert_eq!(received.headers["x-stainless-retry-count"], "0");
}

/// Counts the TCP connections a front door opens to a sidecar, relaying their bytes.
async fn counting_relay(to: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay binds");
    let addr = listener.local_addr().expect("relay address");
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, accepted)
}

/// One calls after another, streamed and not, travel over one kept-alive connection.
async fn connections_to_the_sidecar_are_kept_alive(door: Door) {
    let engine = MockUpstream::start().await;
    let sidecar = Sidecar::start(transparent(&engine)).await;
    let (relay, connections) = counting_relay(sidecar.addr).await;
    let front = start(door, &[relay]).await;

    let client = client();
    for i in 0..6 {
        let response = client
            .post(front.url("/v1/chat/completions"))
            .json(&chat(i % 2 == 0))
            .send()
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e:?}\n{}", front.logs()));
        assert_eq!(response.status(), 200, "{}", front.logs());
        response.bytes().await.expect("whole body");
    }
    assert_eq!(engine.request_count(), 6);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "six calls in a row should share one upstream connection"
    );
}

/// The door balances calls by load, not by session, so a session's calls land on both
/// sidecars; with the session state shared through Redis, each session — stitched, or named
/// by path, header or OpenClaw's header — is still one trajectory of all its turns.
async fn a_session_spread_over_sidecars_is_one_trajectory(door: Door) {
    let redis = RedisServer::start();
    let engine = MockUpstream::start().await;
    let replica = || {
        let mut config = test_config(&[engine.url()]);
        config.redis = Some(redis.url());
        config
    };
    let sidecars = [
        Sidecar::start(replica()).await,
        Sidecar::start(replica()).await,
    ];
    let front = start(door, &[sidecars[0].addr, sidecars[1].addr]).await;
    let client = client();

    // An agent's conversation with no session id: each turn repeats the last answer.
    let mut messages = vec![json!({"role": "user", "content": "Plan a day in Paris."})];
    for turn in 0..4 {
        let response = client
            .post(front.url("/v1/chat/completions"))
            .json(&json!({"model": "mock-llama", "messages": messages}))
            .send()
            .await
            .expect("the front door answers");
        assert_eq!(response.status(), 200, "{}", front.logs());
        let answer: serde_json::Value = response.json().await.expect("a chat answer");
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": format!("And then? ({turn})")}));
    }
    // Named sessions, each way a call can name one.
    for session in ["task-7-rollout-0", "task-9-rollout-3"] {
        for call in 0..3 {
            let request = match call {
                0 => client.post(front.url(&format!("/s/{session}/v1/chat/completions"))),
                1 => client
                    .post(front.url("/v1/chat/completions"))
                    .header("x-clawback-session", session),
                _ => client
                    .post(front.url("/v1/chat/completions"))
                    .header("x-session-id", session),
            };
            let response = request
                .json(&chat(false))
                .send()
                .await
                .expect("the front door answers");
            assert_eq!(response.status(), 200, "{}", front.logs());
            response.bytes().await.expect("whole body");
        }
    }

    let served: Vec<u64> = sidecars
        .iter()
        .map(|s| s.app.metrics.steps_recorded.get())
        .collect();
    assert!(
        served.iter().all(|&n| n > 0) && served.iter().sum::<u64>() == 10,
        "the door did not spread the calls over both sidecars: {served:?}"
    );
    let store = Arc::clone(
        sidecars[0]
            .app
            .recorder
            .as_ref()
            .expect("recording")
            .store(),
    );
    let tenant = clawback_datapool::TenantId::new("default").expect("tenant");
    let mut lengths = Vec::new();
    for _ in 0..100 {
        lengths.clear();
        for header in store
            .list_trajectories(&tenant, None, 100)
            .await
            .unwrap_or_default()
        {
            if let Ok(Some(record)) = store.trajectory(&tenant, &header.id).await {
                lengths.push(record.steps.len());
            }
        }
        lengths.sort_unstable();
        if lengths.iter().sum::<usize>() == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lengths, [3, 3, 4], "sessions were split or merged");
}

#[test]
fn the_shipped_nginx_config_is_valid_as_it_is() {
    let site = repo_root().join("deploy/nginx/clawback.conf");
    if let Err(e) = nginx_check(&site) {
        panic!("nginx -t rejects deploy/nginx/clawback.conf:\n{e}");
    }
}

/// Settings whose absence the live tests cannot always see: nginx 1.22 hands a small event on
/// even with buffering on, until a slow client or a large answer makes it spool to disk.
#[test]
fn the_nginx_config_streams_and_waits_long() {
    let shipped = std::fs::read_to_string(repo_root().join("deploy/nginx/clawback.conf"))
        .expect("deploy/nginx/clawback.conf");
    let directives: Vec<String> = shipped
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    for wanted in [
        "proxy_buffering off;",
        "proxy_request_buffering off;",
        "proxy_http_version 1.1;",
        "proxy_set_header Connection \"\";",
        "proxy_read_timeout 3600s;",
        "proxy_send_timeout 3600s;",
        "keepalive 64;",
        "proxy_pass_request_headers on;",
    ] {
        assert!(
            directives.iter().any(|d| d == wanted),
            "deploy/nginx/clawback.conf lacks `{wanted}`"
        );
    }
}

#[tokio::test]
async fn nginx_passes_a_stream_event_by_event() {
    a_stream_passes_event_by_event(Door::Nginx).await;
}

#[tokio::test]
async fn nginx_passes_headers_both_ways() {
    headers_pass_both_ways(Door::Nginx).await;
}

#[tokio::test]
async fn nginx_keeps_its_connections_to_the_sidecar_alive() {
    connections_to_the_sidecar_are_kept_alive(Door::Nginx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_spreads_a_session_over_sidecars_and_it_stays_one_trajectory() {
    a_session_spread_over_sidecars_is_one_trajectory(Door::Nginx).await;
}

#[test]
fn the_shipped_envoy_config_is_valid_as_it_is() {
    let config = repo_root().join("deploy/envoy/envoy.yaml");
    if let Err(e) = envoy_check(&config) {
        panic!("envoy --mode validate rejects deploy/envoy/envoy.yaml:\n{e}");
    }
}

#[test]
fn the_envoy_config_rendered_for_tests_is_valid() {
    let shipped = std::fs::read_to_string(repo_root().join("deploy/envoy/envoy.yaml"))
        .expect("deploy/envoy/envoy.yaml");
    let sidecars = [
        SocketAddr::from(([127, 0, 0, 1], 18100)),
        SocketAddr::from(([127, 0, 0, 1], 18101)),
    ];
    let rendered = envoy_config(
        &shipped,
        &sidecars,
        SocketAddr::from(([127, 0, 0, 1], 18080)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = scratch_dir("envoy-render");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, &rendered).expect("write rendered config");
    if let Err(e) = envoy_check(&path) {
        panic!("envoy rejects the rendered config:\n{e}\n{rendered}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn envoy_passes_a_stream_event_by_event() {
    a_stream_passes_event_by_event(Door::Envoy).await;
}

#[tokio::test]
async fn envoy_passes_headers_both_ways() {
    headers_pass_both_ways(Door::Envoy).await;
}

#[tokio::test]
async fn envoy_keeps_its_connections_to_the_sidecar_alive() {
    connections_to_the_sidecar_are_kept_alive(Door::Envoy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_spreads_a_session_over_sidecars_and_it_stays_one_trajectory() {
    a_session_spread_over_sidecars_is_one_trajectory(Door::Envoy).await;
}
