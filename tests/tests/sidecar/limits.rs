//! The sidecar's own limits: body size, concurrency, and every timeout — each answered with an
//! OpenAI-style error, never a hang.

use std::sync::Arc;
use std::time::Duration;

use clawback_sidecar::data_plane::share::Shares;
use clawback_tests::harness::{test_config, Sidecar};
use clawback_tests::mock::{Behaviour, Hold, MockUpstream};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";

use crate::support::{assert_openai_error, chat_request, client, eventually, post_chat, sse_data};

#[tokio::test]
async fn a_body_over_the_limit_gets_413_and_never_reaches_the_engine() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.limits.max_body_bytes = 4096;
    let sidecar = Sidecar::start(config).await;
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(10_000)}]});

    let declared = client()
        .post(sidecar.url("/v1/chat/completions"))
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(declared.status(), 413);
    assert_openai_error(&declared.json().await.unwrap(), "body_too_large");

    // Without a Content-Length the limit is enforced while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(serde_json::to_vec(&big).unwrap())];
    let chunked = client()
        .post(sidecar.url("/v1/chat/completions"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(chunked.status(), 413);
    assert_openai_error(&chunked.json().await.unwrap(), "body_too_large");
    assert_eq!(engine.request_count(), 0);
}

/// A history of many tiny messages, small in bytes, large once parsed: refused by its count of
/// JSON values before it is built, in the agent's API shape.
#[tokio::test]
async fn a_body_of_too_many_values_gets_400_and_never_reaches_the_engine() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.limits.max_body_values = 10_000;
    let sidecar = Sidecar::start(config).await;
    let messages = vec![json!({"role": "user", "content": ""}); 5_000];
    for (path, extra) in [
        ("/v1/chat/completions", json!({})),
        ("/v1/messages", json!({"max_tokens": 16})),
    ] {
        let mut body = json!({"model": "m", "messages": messages});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let answer = client()
            .post(sidecar.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{path}");
        let error: Value = answer.json().await.unwrap();
        assert!(
            error.to_string().contains("more than 10000 JSON values"),
            "{path}: {error}"
        );
    }
    assert_eq!(engine.request_count(), 0);
    // A history within the budget is served.
    let fits =
        json!({"model": "m", "messages": vec![json!({"role": "user", "content": "hi"}); 100]});
    let answer = client()
        .post(sidecar.url("/v1/chat/completions"))
        .json(&fits)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn past_the_concurrency_limit_requests_are_shed_with_retry_after() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        head_delay: Duration::from_millis(800),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.limits.max_concurrent_requests = 2;
    config.limits.retry_after_secs = 2;
    config.claw_r1.enabled = true;
    let sidecar = Arc::new(Sidecar::start(config).await);

    let held: Vec<_> = (0..2)
        .map(|_| {
            let sidecar = Arc::clone(&sidecar);
            tokio::spawn(async move { post_chat(&sidecar, false).await.status() })
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || engine.request_count() == 2).await);

    let shed = post_chat(&sidecar, false).await;
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers()["retry-after"], "2");
    assert_openai_error(&shed.json().await.unwrap(), "overloaded");
    // A model call under a Claw-R1 base_url is one too.
    let claw = client()
        .post(sidecar.url("/uid-1/prompt-1/v1/chat/completions"))
        .json(&chat_request(false))
        .send()
        .await
        .unwrap();
    assert_eq!(claw.status(), 503);
    // Health endpoints are not shed.
    assert_eq!(
        client()
            .get(sidecar.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    for call in held {
        assert_eq!(call.await.unwrap(), 200);
    }
    assert_eq!(engine.request_count(), 2);
}

/// A tenant's slow uploads (a valid key, bodies trickled) hold its own share of the calls in
/// flight only: past its share it gets 429, and another tenant is still served.
#[tokio::test]
async fn a_tenants_slow_uploads_hold_its_own_share_and_the_others_are_served() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.limits.max_concurrent_requests = 8;
    crate::support::alpha_and_bravo(&mut config);
    let sidecar = Sidecar::start(config).await;

    // Alpha opens 8 uploads and sends a few bytes of each: half its share, half refused.
    let mut uploads = Vec::new();
    let mut refused = 0;
    for _ in 0..8 {
        let mut stream = TcpStream::connect(sidecar.addr).await.unwrap();
        stream
            .write_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-alpha\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"model\":",
            )
            .await
            .unwrap();
        let mut answer = vec![0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut answer)).await {
            Ok(read) => {
                let answer = String::from_utf8_lossy(&answer[..read.unwrap()]).into_owned();
                assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
                assert!(answer.contains("retry-after: 1"), "{answer}");
                assert!(
                    answer.contains("\"code\":\"tenant_overloaded\""),
                    "{answer}"
                );
                refused += 1;
            }
            Err(_) => uploads.push(stream),
        }
    }
    assert_eq!((uploads.len(), refused), (4, 4));

    // Bravo is served meanwhile, two at a time (a call's permit is given back a moment after
    // its answer, once the upstream call has ended: two leave room for that).
    for _ in 0..10 {
        let calls = (0..2).map(|_| async {
            let answer = client()
                .post(sidecar.url("/v1/chat/completions"))
                .bearer_auth("sk-bravo")
                .json(&chat_request(false))
                .send()
                .await
                .unwrap();
            let status = answer.status();
            answer.bytes().await.unwrap();
            status
        });
        for status in futures_util::future::join_all(calls).await {
            assert_eq!(status, 200);
        }
    }
    drop(uploads);
}

#[tokio::test]
async fn an_engine_that_never_answers_gets_504() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        head_delay: Duration::from_secs(30),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.timeouts.upstream_first_byte = Duration::from_millis(300);
    let sidecar = Sidecar::start(config).await;

    let response = post_chat(&sidecar, false).await;
    assert_eq!(response.status(), 504);
    assert_openai_error(&response.json().await.unwrap(), "upstream_timeout");
}

#[tokio::test]
async fn an_engine_that_stalls_mid_stream_ends_the_stream_with_an_error_event() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        chunk_delay: Duration::from_secs(30),
        ..Behaviour::default()
    });
    let mut config = test_config(&[engine.url()]);
    config.timeouts.upstream_idle = Duration::from_millis(300);
    let sidecar = Sidecar::start(config).await;

    let body = post_chat(&sidecar, true).await.bytes().await.unwrap();
    let events = sse_data(&body);
    assert_eq!(events.len(), 2, "{events:?}");
    let error: Value = serde_json::from_str(&events[1]).unwrap();
    assert_openai_error(&error, "upstream_stream_broken");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.timeouts.header_read = Duration::from_millis(300);
    let sidecar = Sidecar::start(config).await;

    let mut socket = TcpStream::connect(sidecar.addr).await.unwrap();
    socket
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: sidecar\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the connection was kept open");
    assert_eq!(engine.request_count(), 0);
}

#[tokio::test]
async fn a_client_that_never_finishes_its_body_gets_408() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.timeouts.body_read = Duration::from_millis(300);
    let sidecar = Sidecar::start(config).await;

    let mut socket = TcpStream::connect(sidecar.addr).await.unwrap();
    socket
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: sidecar\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":")
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut answer))
        .await
        .expect("an answer before the client gives up")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    assert_eq!(engine.request_count(), 0);
}

/// A request that announces a large body and sends a few bytes of it: a control route must
/// answer it from its headers, not wait for (or hold) the body.
async fn announce_a_large_body(sidecar: &Sidecar, path: &str, headers: &str) -> String {
    let mut stream = TcpStream::connect(sidecar.addr)
        .await
        .expect("the sidecar accepts");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}content-length: 8000000\r\n\r\n{{\"a\":"
    );
    stream.write_all(head.as_bytes()).await.expect("sends");
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
        .await
        .expect("an answer before the body came")
        .expect("reads");
    String::from_utf8_lossy(&answer[..read]).into_owned()
}

#[tokio::test]
async fn control_routes_refuse_before_reading_a_body_and_take_small_ones_only() {
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.admin.token = Some("admin-secret".to_owned());
    config.timeouts.body_read = Duration::from_secs(30);
    let sidecar = Sidecar::start(config).await;

    // No token for the handshake API; Claw-R1 not enabled: refused from the headers.
    let answer = announce_a_large_body(&sidecar, "/trajectories", "").await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let answer = announce_a_large_body(&sidecar, "/init_trajectory", "").await;
    assert!(
        answer.starts_with("HTTP/1.1 404") || answer.starts_with("HTTP/1.1 403"),
        "{answer}"
    );
    // With the token, a body past the control limit (1 MiB) is refused as it is announced.
    let answer = announce_a_large_body(
        &sidecar,
        "/trajectories",
        "authorization: Bearer admin-secret\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

/// The head of `key`'s upload to `path` of a body of `length` bytes, and its first few bytes.
fn upload_head(path: &str, key: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {length}\r\n\r\n{{\"model\":"
    )
}

/// `key`'s slow uploads to `path` (a head declaring a body of `length` bytes, and a few bytes of
/// it), one after another, until the sidecar refuses one; the uploads it holds and the refusal. Each
/// upload is known held when `tenant`'s count in `shares` went up, refused when its answer
/// arrived: no wait depends on the host's speed.
/// Each attacker's slow uploads (see [`slow_uploads_until_refused`]), held open; each attacker's
/// refusal must be a 429 with `code` and a `Retry-After`.
async fn attack_until_refused(
    addr: std::net::SocketAddr,
    shares: &Shares,
    attackers: &[(&str, &str)],
    upload: (&str, usize),
    code: &str,
) -> Vec<Vec<TcpStream>> {
    let mut attack = Vec::new();
    for &attacker in attackers {
        let (uploads, refusal) = slow_uploads_until_refused(addr, shares, attacker, upload).await;
        assert!(refusal.starts_with("HTTP/1.1 429"), "{refusal}");
        assert!(refusal.contains("retry-after: 1"), "{refusal}");
        assert!(
            refusal.contains(&format!("\"code\":\"{code}\"")),
            "{refusal}"
        );
        attack.push(uploads);
    }
    attack
}

async fn slow_uploads_until_refused(
    addr: std::net::SocketAddr,
    shares: &Shares,
    (key, tenant): (&str, &str),
    (path, length): (&str, usize),
) -> (Vec<TcpStream>, String) {
    let tenant = clawback_datapool::TenantId::new(tenant).expect("a tenant");
    let mut held = Vec::new();
    loop {
        let before = shares.held(&tenant);
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(upload_head(path, key, length).as_bytes())
            .await
            .unwrap();
        let mut answer = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if shares.held(&tenant) > before {
                held.push(stream);
                break;
            }
            match tokio::time::timeout(Duration::from_millis(20), stream.read(&mut answer)).await {
                Ok(read) => {
                    let answer = String::from_utf8_lossy(&answer[..read.unwrap()]).into_owned();
                    return (held, answer);
                }
                Err(_) => assert!(tokio::time::Instant::now() < deadline, "no answer"),
            }
        }
    }
}

/// Gives `config` the keys of eve (`sk-eve`), mallory (`sk-mallory`) and `honest` honest
/// tenants (`sk-honest-{i}`, tenant `honest-{i}`); the honest keys.
fn attackers_and_honest(
    config: &mut clawback_sidecar::config::Config,
    honest: usize,
) -> Vec<String> {
    let honest: Vec<(String, String)> = (0..honest)
        .map(|i| (format!("sk-honest-{i}"), format!("honest-{i}")))
        .collect();
    let attackers = [("sk-eve", "eve"), ("sk-mallory", "mallory")];
    let keys = attackers
        .into_iter()
        .chain(honest.iter().map(|(k, t)| (k.as_str(), t.as_str())));
    for (key, tenant) in keys {
        config.tenants.keys.insert(
            clawback_sidecar::data_plane::tenant::key_hash(key),
            tenant.to_owned(),
        );
    }
    honest.into_iter().map(|(key, _)| key).collect()
}

/// Each of `tenants` makes `calls` calls one after another, all tenants at once; the statuses
/// and the latencies of all.
async fn honest_load(
    sidecar: &Sidecar,
    tenants: &[String],
    calls: usize,
) -> (Vec<u16>, Vec<Duration>) {
    let runs = tenants.iter().map(|key| async move {
        let mut out = Vec::new();
        for _ in 0..calls {
            let started = std::time::Instant::now();
            let answer = client()
                .post(sidecar.url("/v1/chat/completions"))
                .bearer_auth(key)
                .json(&chat_request(false))
                .send()
                .await
                .unwrap();
            let status = answer.status().as_u16();
            answer.bytes().await.unwrap();
            out.push((status, started.elapsed()));
        }
        out
    });
    futures_util::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .unzip()
}

fn p99(latencies: &mut [Duration]) -> Duration {
    latencies.sort();
    latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
}

/// Two colluding tenants and the default tenant (any junk key) fill what they can with slow
/// uploads before eight honest tenants come: the first three hold 32, 11 and 5 of 64 places,
/// cannot grow past their share of the eleven tenants then active however hard they push, and
/// every honest call is served.
#[tokio::test]
async fn two_colluding_tenants_and_the_default_tenant_leave_eight_honest_tenants_served() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        head_delay: Duration::from_millis(20),
        ..Behaviour::default()
    });
    let config = || {
        let mut config = test_config(&[engine.url()]);
        config.limits.max_concurrent_requests = 64;
        assert_eq!(config.tenants.default.as_deref(), Some("default"));
        let honest = attackers_and_honest(&mut config, 8);
        (config, honest)
    };
    let (quiet, honest) = config();
    let quiet = Sidecar::start(quiet).await;
    let (statuses, mut alone) = honest_load(&quiet, &honest, 10).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    let sidecar = Sidecar::start(config().0).await;
    let attackers = [
        ("sk-eve", "eve"),
        ("sk-mallory", "mallory"),
        ("sk-junk-1", "default"),
    ];
    let attack = attack_until_refused(
        sidecar.addr,
        &sidecar.app.calls,
        &attackers,
        (CHAT, 100_000),
        "tenant_overloaded",
    )
    .await;
    let held: Vec<usize> = attack.iter().map(Vec::len).collect();
    assert_eq!(held, [32, 11, 5]);
    let (statuses, mut abused) = honest_load(&sidecar, &honest, 10).await;
    assert_eq!(statuses.len(), 80);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    eprintln!(
        "honest p99: {:?} under attack, {:?} without (80 calls each, mock engine 20 ms)",
        p99(&mut abused),
        p99(&mut alone)
    );

    // With the eight honest tenants in flight, eleven are active: however hard the first three
    // push (another junk key is the same default tenant), none gets a place more.
    let hold = Hold::after_chunks(0);
    engine.set_behaviour(Behaviour {
        hold: Some(hold.clone()),
        ..Behaviour::default()
    });
    let in_flight: Vec<_> = honest
        .iter()
        .map(|key| {
            let request = client()
                .post(sidecar.url("/v1/chat/completions"))
                .bearer_auth(key)
                .json(&chat_request(false));
            tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    let calls = &sidecar.app.calls;
    let all_in_flight = eventually(Duration::from_secs(30), || {
        (0..8).all(|i| {
            calls.held(&clawback_datapool::TenantId::new(format!("honest-{i}")).expect("tenant"))
                == 1
        })
    })
    .await;
    assert!(all_in_flight);
    for key in ["sk-eve", "sk-mallory", "sk-junk-2"] {
        let answer = client()
            .post(sidecar.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&chat_request(false))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 429, "{key}");
        let body: Value = answer.json().await.unwrap();
        assert_openai_error(&body, "tenant_overloaded");
    }
    hold.release();
    for call in in_flight {
        assert_eq!(call.await.unwrap().unwrap(), 200);
    }
    drop(attack);
}

/// Bodies are shared by their bytes as calls are by their count: two colluding keys and the
/// default tenant, declaring large bodies they never finish, hold 2 MiB, ½ MiB and ½ MiB of a
/// 4 MiB budget (taken before the body is read, by what the head declares) and get 429 past
/// it; four honest tenants are all served in what is left, and a body larger than what is left
/// gets 503 while the others go on.
#[tokio::test]
async fn colluding_tenants_declaring_large_bodies_hold_only_their_share_of_the_bytes() {
    const QUARTER_MIB: usize = 256 << 10;
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.limits.max_body_bytes = 1 << 20;
    config.limits.max_buffered_bytes = 4 << 20;
    let honest = attackers_and_honest(&mut config, 4);
    let sidecar = Sidecar::start(config).await;

    let bytes = &sidecar.app.bytes;
    let attackers = [
        ("sk-eve", "eve"),
        ("sk-mallory", "mallory"),
        ("sk-junk", "default"),
    ];
    let attack = attack_until_refused(
        sidecar.addr,
        bytes,
        &attackers,
        (CHAT, QUARTER_MIB),
        "tenant_buffers_full",
    )
    .await;
    let held: Vec<usize> = attack.iter().map(Vec::len).collect();
    assert_eq!(held, [8, 2, 2]);

    let (statuses, _) = honest_load(&sidecar, &honest, 5).await;
    assert_eq!(statuses.len(), 20);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    // One honest upload in flight leaves ¾ MiB: a body declaring 1 MiB does not fit the whole.
    let (upload, refusal) = slow_uploads_until_refused(
        sidecar.addr,
        bytes,
        ("sk-honest-0", "honest-0"),
        (CHAT, QUARTER_MIB),
    )
    .await;
    assert_eq!(upload.len(), 1, "{refusal}");
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\
                authorization: Bearer sk-honest-1\r\ncontent-type: application/json\r\n\
                content-length: 1048576\r\n\r\n";
    let mut stream = TcpStream::connect(sidecar.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let read = stream.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("\"code\":\"buffers_full\""), "{answer}");
    let (statuses, _) = honest_load(&sidecar, &honest[1..], 2).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    drop((attack, upload));
}

/// Control routes' uploads hold their tenant's shares as calls do, and the admin port has its
/// own connections: a tenant's slow Claw-R1 uploads (any key, the default tenant's too) and its
/// viewer token's uploads stop at its share of the 8 agent connections, the honest tenants are
/// served in the rest, and with every agent connection busy the admin port still answers.
#[tokio::test]
async fn slow_control_uploads_hold_their_tenants_share_and_the_admin_port_has_its_own_connections()
{
    const INIT: &str = "/init_trajectory";
    let engine = MockUpstream::start().await;
    let mut config = test_config(&[engine.url()]);
    config.limits.max_connections = 8;
    config.claw_r1.enabled = true;
    config.admin.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admin.token = Some("admin-secret".to_owned());
    let hash = clawback_sidecar::data_plane::tenant::key_hash;
    config
        .admin
        .tenant_tokens
        .insert(hash("eve-viewer"), "eve".to_owned());
    attackers_and_honest(&mut config, 2);
    let sidecar = Sidecar::start(config).await;
    let calls = &sidecar.app.calls;

    let attackers = [("sk-eve", "eve"), ("sk-junk", "default")];
    let attack = attack_until_refused(
        sidecar.addr,
        calls,
        &attackers,
        (INIT, 100_000),
        "tenant_overloaded",
    )
    .await;
    let held: Vec<usize> = attack.iter().map(Vec::len).collect();
    assert_eq!(held, [4, 2]);
    // Eve's viewer token is eve: its upload is refused as it is announced.
    let admin = sidecar.admin_addr.expect("an admin listener");
    let (uploads, refusal) = slow_uploads_until_refused(
        admin,
        calls,
        ("eve-viewer", "eve"),
        (
            "/trajectories/00000000-0000-0000-0000-000000000000/feedback",
            1000,
        ),
    )
    .await;
    assert!(
        uploads.is_empty() && refusal.starts_with("HTTP/1.1 429"),
        "{refusal}"
    );

    // One client, its kept-alive connections: at the cap, a new connection closes the idlest
    // one, which may be another client's that has not sent its request yet.
    let honest = ["sk-honest-0", "sk-honest-1"];
    let one = client();
    for key in honest.iter().cycle().take(10) {
        let answer = one
            .post(sidecar.url(CHAT))
            .bearer_auth(key)
            .json(&chat_request(false))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{key}");
        answer.bytes().await.unwrap();
    }

    // An upload of each honest tenant takes the last two agent connections, one after the other
    // (at the cap, a connection that has sent no request yet is the idlest, and is closed).
    drop(one);
    let honest = [("sk-honest-0", "honest-0"), ("sk-honest-1", "honest-1")].map(|(key, tenant)| {
        (
            key,
            clawback_datapool::TenantId::new(tenant).expect("tenant"),
        )
    });
    // A call's unit comes back a moment after its answer, once its upstream call has ended.
    let ended = eventually(Duration::from_secs(30), || {
        honest.iter().all(|(_, tenant)| calls.held(tenant) == 0)
    });
    assert!(ended.await);
    let mut last = Vec::new();
    for (key, tenant) in &honest {
        let mut stream = TcpStream::connect(sidecar.addr).await.unwrap();
        stream
            .write_all(upload_head(CHAT, key, 100_000).as_bytes())
            .await
            .unwrap();
        last.push(stream);
        let held = eventually(Duration::from_secs(30), || calls.held(tenant) == 1).await;
        assert!(held, "{tenant}");
    }
    let metrics = client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    let tenants = client()
        .get(format!("http://{admin}/tenants"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(tenants.status(), 200);
    drop((attack, last));
}
