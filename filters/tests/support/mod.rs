//! What the host tests share: the built plugin components, a host started on a directory of
//! them, the example trajectory as fixture, and a scripted judge on a loopback port.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::{Evaluation, NextState, Step, TenantId, Trajectory};
use clawback_filters::{Filters, FiltersConfig, JudgeConfig, Metrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A built plugin component; fails with what to run when the plugins were not built.
pub fn plugin_file(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let path = root
        .join("wasm-plugins/target/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the plugins first with \
         `cd wasm-plugins && cargo build --release --target wasm32-wasip2` \
         (scripts/test does it)",
        path.display()
    );
    path
}

/// A host on a fresh directory holding `plugins`, its evaluations arriving on the receiver.
pub struct Host {
    pub filters: Filters,
    pub evaluations: mpsc::UnboundedReceiver<Vec<Evaluation>>,
    pub dir: tempfile::TempDir,
    pub metrics: Metrics,
}

pub async fn host(plugins: &[&str], tweak: impl FnOnce(&mut FiltersConfig)) -> Host {
    host_sharing(plugins, 1.0, tweak).await
}

/// [`host`], each tenant holding at most `fraction` of the queue and of the calls at once.
pub async fn host_sharing(
    plugins: &[&str],
    fraction: f64,
    tweak: impl FnOnce(&mut FiltersConfig),
) -> Host {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in plugins {
        std::fs::copy(plugin_file(name), dir.path().join(format!("{name}.wasm")))
            .expect("plugin copied");
    }
    let mut config = FiltersConfig {
        dir: Some(dir.path().to_owned()),
        reload_interval: Duration::ZERO,
        ..FiltersConfig::default()
    };
    tweak(&mut config);
    let (tx, evaluations) = mpsc::unbounded_channel();
    let metrics = Metrics::default();
    let part = |total: usize| ((total as f64 * fraction).ceil() as usize).max(1);
    let share = clawback_filters::fair::TenantShare {
        queued: clawback_filters::fair::FixedShare::new(part(config.queue_capacity)),
        running: part(config.max_concurrency),
    };
    let filters = Filters::start(
        config,
        share,
        metrics.clone(),
        Arc::new(move |batch| {
            let _ = tx.send(batch);
        }),
    )
    .await
    .expect("plugins load");
    Host {
        filters,
        evaluations,
        dir,
        metrics,
    }
}

impl Host {
    /// Records `step` in `trajectory`, gives it `next`, and waits for its evaluations.
    pub async fn evaluate(
        &mut self,
        trajectory: &Trajectory,
        step: &Step,
        next: &NextState,
    ) -> Vec<Evaluation> {
        self.filters.opened(trajectory);
        self.filters.step_recorded(step);
        self.filters
            .next_state(&trajectory.tenant, trajectory.id, step.id, next);
        self.next_batch().await
    }

    pub async fn next_batch(&mut self) -> Vec<Evaluation> {
        tokio::time::timeout(Duration::from_secs(60), self.evaluations.recv())
            .await
            .expect("evaluations within a minute")
            .expect("the host is running")
    }
}

/// The example trajectory: a tool call answered by a clean tool result, then an answer the
/// user thanks for.
pub fn fixture() -> (Trajectory, Vec<Step>) {
    let record = tool_use_trajectory(TenantId::new("acme").expect("tenant"));
    (record.trajectory, record.steps)
}

pub fn next_of(step: &Step) -> NextState {
    step.next_state
        .clone()
        .expect("the fixture's steps have next states")
}

pub fn tool_result(content: &str) -> NextState {
    NextState {
        messages: vec![serde_json::json!({
            "role": "tool",
            "tool_call_id": "chatcmpl-tool-8f3b2a1c9d4e4f6a",
            "content": content,
        })],
        observed_at: clawback_datapool::UnixMs(1_733_140_801_204),
    }
}

/// A judge that answers chat completions with `answers`, in turn.
pub struct ScriptedJudge {
    pub url: String,
    pub requests: Arc<AtomicUsize>,
}

pub async fn scripted_judge(answers: Vec<String>) -> ScriptedJudge {
    scripted_judge_after(answers, Duration::ZERO).await
}

/// [`scripted_judge`], each answer sent `delay` after its request came.
pub async fn scripted_judge_after(answers: Vec<String>, delay: Duration) -> ScriptedJudge {
    scripted_judge_with(answers, move |_| delay).await
}

/// [`scripted_judge`], the answer to the `n`th request (from 0) sent `delay_of(n)` after it came.
pub async fn scripted_judge_with(
    answers: Vec<String>,
    delay_of: impl Fn(usize) -> Duration + Send + 'static,
) -> ScriptedJudge {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("judge binds");
    let addr = listener.local_addr().expect("judge address");
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&requests);
    let answers = Arc::new(answers);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let answer = answers[n % answers.len()].clone();
            let delay = delay_of(n);
            tokio::spawn(async move {
                if read_request(&mut stream).await.is_none() {
                    return;
                }
                tokio::time::sleep(delay).await;
                let body = serde_json::json!({
                    "id": format!("chatcmpl-judge-{n}"),
                    "object": "chat.completion",
                    "model": "judge",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": answer}}],
                })
                .to_string();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    ScriptedJudge {
        url: format!("http://{addr}/v1"),
        requests,
    }
}

/// Reads one HTTP/1.1 request with a content-length body.
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buffer.len() < end + 4 + length {
                let read = stream.read(&mut chunk).await.ok()?;
                if read == 0 {
                    return None;
                }
                buffer.extend_from_slice(&chunk[..read]);
            }
            return Some(buffer[end + 4..].to_vec());
        }
    }
}

pub fn judge_config(url: &str) -> JudgeConfig {
    JudgeConfig {
        url: url.to_owned(),
        model: "judge".to_owned(),
        api_key: None,
        timeout: Duration::from_secs(10),
        max_concurrency: 4,
        budget_per_evaluation: 8,
        temperature: 0.6,
        max_tokens: 256,
    }
}
