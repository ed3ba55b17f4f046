//! Several engines behind one sidecar: balancing, passive health, and failover only where it is
//! safe.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawback_sidecar::config::BalancerKind;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::{Behaviour, MockUpstream};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::support::{assert_openai_error, client, eventually, post_chat};

/// A loopback address nothing listens on.
async fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

#[tokio::test]
async fn a_refused_connection_fails_over_and_ejects_the_dead_engine() {
    let live = MockUpstream::start().await;
    let mut config = test_config(&[closed_port().await, live.url()]);
    // Every call here has the same opening, which affinity would send to one engine for good;
    // least outstanding without it picks the dead engine first.
    config.balancer = BalancerKind::LeastOutstanding;
    config.affinity.enabled = false;
    let sidecar = Sidecar::start(config).await;

    for _ in 0..10 {
        assert_eq!(post_chat(&sidecar, false).await.status(), 200);
    }
    assert_eq!(live.request_count(), 10);
    assert_eq!(sidecar.app.pool.healthy_count(), 1);
    let metrics = client()
        .get(sidecar.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("clawback_upstream_ejections_total"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_run_of_gateway_failures_ejects_an_engine_without_replaying_requests() {
    let failing = MockUpstream::start().await;
    failing.set_behaviour(Behaviour {
        fail_with: Some(503),
        ..Behaviour::default()
    });
    let healthy = MockUpstream::start().await;
    let mut config = test_config(&[failing.url(), healthy.url()]);
    config.health.eject_after_5xx = 2;
    config.health.ejection = Duration::from_secs(60);
    // Every call here has the same opening, which affinity would send to one engine for good;
    // least outstanding without it picks the failing engine until it is ejected.
    config.balancer = BalancerKind::LeastOutstanding;
    config.affinity.enabled = false;
    let sidecar = Sidecar::start(config).await;

    let mut server_errors = 0;
    for _ in 0..12 {
        if post_chat(&sidecar, false).await.status() == 503 {
            server_errors += 1;
        }
    }
    // Each 503 reached the agent as the engine's answer; none was retried elsewhere.
    assert_eq!(server_errors, 2);
    assert_eq!(failing.request_count(), 2);
    assert_eq!(healthy.request_count(), 10);
    assert_eq!(sidecar.app.pool.healthy_count(), 1);
}

#[tokio::test]
async fn a_request_an_engine_may_have_started_is_never_replayed() {
    // Accepts, reads the request, then drops the connection without an answer.
    let half_dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let half_dead_url = format!("http://{}", half_dead.local_addr().unwrap());
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&reads);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = half_dead.accept().await {
            let mut buf = vec![0u8; 65536];
            let _ = socket.read(&mut buf).await;
            counted.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    let healthy = MockUpstream::start().await;
    let mut config = test_config(&[half_dead_url, healthy.url()]);
    // Least outstanding without affinity: the first (half-dead) engine is picked for sure.
    config.balancer = BalancerKind::LeastOutstanding;
    config.affinity.enabled = false;
    let sidecar = Sidecar::start(config).await;

    let response = post_chat(&sidecar, false).await;
    assert_eq!(response.status(), 502);
    assert_openai_error(&response.json().await.unwrap(), "upstream_failed");
    assert_eq!(reads.load(Ordering::SeqCst), 1);
    assert_eq!(healthy.request_count(), 0, "the request was replayed");
}

#[tokio::test]
async fn with_every_engine_down_agents_get_503_and_the_sidecar_is_not_ready() {
    let mut config = test_config(&[closed_port().await, closed_port().await]);
    config.health.ejection = Duration::from_secs(60);
    let sidecar = Sidecar::start(config).await;

    let first = post_chat(&sidecar, false).await;
    assert_eq!(first.status(), 502);
    assert_openai_error(&first.json().await.unwrap(), "upstream_connect_failed");

    let next = post_chat(&sidecar, false).await;
    assert_eq!(next.status(), 503);
    assert_openai_error(&next.json().await.unwrap(), "no_healthy_upstream");
    let ready = client().get(sidecar.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let health = client().get(sidecar.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn an_ejected_engine_is_tried_again_after_its_ejection_period() {
    let flaky = MockUpstream::start().await;
    flaky.set_behaviour(Behaviour {
        fail_with: Some(503),
        ..Behaviour::default()
    });
    let mut config = test_config(&[flaky.url()]);
    config.health.eject_after_5xx = 1;
    config.health.ejection = Duration::from_millis(300);
    let sidecar = Sidecar::start(config).await;

    assert_eq!(post_chat(&sidecar, false).await.status(), 503);
    assert_eq!(sidecar.app.pool.healthy_count(), 0);
    flaky.set_behaviour(Behaviour::default());
    assert!(
        eventually(Duration::from_secs(5), || sidecar.app.pool.healthy_count()
            == 1)
        .await
    );
    assert_eq!(post_chat(&sidecar, false).await.status(), 200);
    assert_eq!(flaky.request_count(), 2);
}

#[tokio::test]
async fn concurrent_load_spreads_over_healthy_engines() {
    let a = MockUpstream::start().await;
    let b = MockUpstream::start().await;
    for engine in [&a, &b] {
        engine.set_behaviour(Behaviour {
            head_delay: Duration::from_millis(50),
            ..Behaviour::default()
        });
    }
    let sidecar = Arc::new(Sidecar::start(test_config(&[a.url(), b.url()])).await);

    let calls: Vec<_> = (0..40)
        .map(|_| {
            let sidecar = Arc::clone(&sidecar);
            tokio::spawn(async move { post_chat(&sidecar, false).await.status() })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    let (a, b) = (a.request_count(), b.request_count());
    assert_eq!(a + b, 40);
    assert!(a >= 10 && b >= 10, "unbalanced: {a} vs {b}");
}

/// Runs `sessions` three-turn conversations (no session ids: stitched) through a sidecar in front
/// of two engines; the share of follow-up turns that reached the engine which served the turn
/// before (whose prefix cache holds the conversation so far).
async fn same_engine_share(affinity: bool, sessions: usize) -> f64 {
    let engines = [MockUpstream::start().await, MockUpstream::start().await];
    let mut config = test_config(&[engines[0].url(), engines[1].url()]);
    config.affinity.enabled = affinity;
    let sidecar = Sidecar::start(config).await;
    let mut follow_ups = 0;
    let mut same = 0;
    for session in 0..sessions {
        let mut messages =
            vec![serde_json::json!({"role": "user", "content": format!("task {session}")})];
        let mut last_engine = None;
        for turn in 0..3 {
            let before = [engines[0].request_count(), engines[1].request_count()];
            let reply: serde_json::Value = client()
                .post(sidecar.url("/v1/chat/completions"))
                .json(&serde_json::json!({"model": "mock-llama", "messages": messages}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let engine = usize::from(engines[1].request_count() > before[1]);
            if let Some(last) = last_engine {
                follow_ups += 1;
                same += usize::from(last == engine);
            }
            last_engine = Some(engine);
            messages.push(reply["choices"][0]["message"].clone());
            messages
                .push(serde_json::json!({"role": "user", "content": format!("and then {turn}?")}));
        }
    }
    same as f64 / follow_ups as f64
}

#[tokio::test]
async fn a_sessions_turns_stay_on_the_engine_that_holds_its_prefix() {
    let affine = same_engine_share(true, 12).await;
    let balanced = same_engine_share(false, 12).await;
    println!(
        "follow-up turns on the engine of the turn before: affinity {:.0} %, power of two choices {:.0} %",
        affine * 100.0,
        balanced * 100.0
    );
    assert_eq!(affine, 1.0, "a session moved between healthy, idle engines");
}
