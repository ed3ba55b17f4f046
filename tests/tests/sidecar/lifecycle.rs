//! A request's life beyond the happy path: the agent leaves, the sidecar shuts down, the
//! configuration is wrong.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use clawback_sidecar::config::{Config, Overrides};
use clawback_tests::harness::{repo_root, test_config, Sidecar};
use clawback_tests::mock::{Behaviour, MockUpstream};
use futures_util::StreamExt;

use crate::support::{chat_request, client, eventually, post_chat, read_chunks, sse_data};

fn slow_stream() -> Behaviour {
    Behaviour {
        chunk_delay: Duration::from_millis(100),
        ..Behaviour::default()
    }
}

#[tokio::test]
async fn an_agent_leaving_mid_stream_does_not_cancel_the_engine_call() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(slow_stream());
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;

    let response = post_chat(&sidecar, true).await;
    let mut body = response.bytes_stream();
    let _first = body.next().await.unwrap().unwrap();
    drop(body);

    assert!(
        eventually(Duration::from_secs(10), || engine.completed() == 1).await,
        "the engine's response was not read to the end"
    );
    let metrics = client()
        .get(sidecar.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("clawback_orphaned_streams_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_agent_leaving_before_the_answer_does_not_cancel_the_engine_call() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(Behaviour {
        head_delay: Duration::from_millis(600),
        ..Behaviour::default()
    });
    let sidecar = Sidecar::start(test_config(&[engine.url()])).await;

    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(sidecar.url("/v1/chat/completions"))
        .json(&chat_request(false))
        .send()
        .await;
    assert!(gave_up.is_err());
    assert!(eventually(Duration::from_secs(10), || engine.completed() == 1).await);
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_stream_finish_and_refuses_new_connections() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(slow_stream());
    let mut sidecar = Sidecar::start(test_config(&[engine.url()])).await;
    let addr = sidecar.addr;

    let response = post_chat(&sidecar, true).await;
    let drained = sidecar.begin_shutdown();
    let chunks = read_chunks(response).await;
    let body: Vec<u8> = chunks.iter().flat_map(|(_, c)| c.iter().copied()).collect();
    assert_eq!(sse_data(&body).last().map(String::as_str), Some("[DONE]"));

    tokio::time::timeout(Duration::from_secs(10), drained)
        .await
        .expect("draining finished")
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// Starts the real binary; returns it and the address it printed.
fn spawn_sidecar(args: &[&str], envs: &[(&str, &str)]) -> (std::process::Child, String) {
    let data_dir = clawback_tests::harness::scratch_dir("process-data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sidecar"))
        .arg("serve")
        .args(args)
        .env("CLAWBACK_DATA_DIR", &data_dir)
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sidecar binary starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("a first line");
    let url = line
        .trim()
        .strip_prefix("clawback-sidecar listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, url)
}

#[tokio::test]
async fn sigterm_drains_a_stream_and_exits_cleanly() {
    let engine = MockUpstream::start().await;
    engine.set_behaviour(slow_stream());
    let (mut child, url) = spawn_sidecar(
        &["--listen", "127.0.0.1:0"],
        &[
            ("CLAWBACK_UPSTREAM", &engine.url()),
            ("CLAWBACK_LOG__FILTER", "warn"),
        ],
    );

    let response = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_request(true))
        .send()
        .await
        .unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let body = response.bytes().await.unwrap();
    assert_eq!(sse_data(&body).last().map(String::as_str), Some("[DONE]"));

    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn an_invalid_config_fails_at_start_naming_the_bad_key() {
    let dir = std::env::temp_dir().join(format!("clawback-bad-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\n[limits]\nmax_body_bites = 10\n",
    )
    .unwrap();

    let output = Command::new(env!("CARGO_BIN_EXE_sidecar"))
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("max_body_bites"), "{stderr}");

    std::fs::write(&file, "[timeouts]\nupstream_idle = \"soon\"\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sidecar"))
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("upstream_idle"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_example_config_loads_and_says_what_it_sets() {
    let path = repo_root().join("deploy/clawback.example.toml");
    let config = Config::load(Some(&path), &Overrides::default()).unwrap();
    assert_eq!(config.listen.port(), 8100);
    assert!(!config.upstreams.is_empty());
    let overridden = Config::load(
        Some(&path),
        &Overrides {
            set: vec![
                "limits.max_body_bytes=1024".to_owned(),
                "log.format=json".to_owned(),
            ],
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(overridden.limits.max_body_bytes, 1024);
}
