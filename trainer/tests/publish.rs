//! Publishing a new policy version: saved whole, loaded into every backend (retried when a call
//! fails), switched in the datapool, and the previous adapter unloaded once no sidecar has a
//! call on it — or, when a backend will not take it, rolled back with the old version still live.
//!
//! The backends and the sidecar are fakes on loopback ports that speak vLLM's and SGLang's
//! exact endpoint shapes; the datapool is the real embedded store.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clawback_datapool::{LocalStore, PolicyVersion, Store, TenantId};
use clawback_trainer::publish::{
    Backend, BackendKind, Mode, PublishConfig, PublishError, Publisher, Sidecar,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// What a fake backend holds and was asked, in order.
#[derive(Default)]
struct Engine {
    kind: Option<BackendKind>,
    loaded: Mutex<BTreeSet<String>>,
    /// The weights directory last reloaded from.
    weights: Mutex<Option<String>>,
    /// `load 'acme@v1'`, `unload 'acme@v1'`, `weights '/path'` — everything it was asked.
    log: Arc<Mutex<Vec<String>>>,
    /// Fail this many load (or reload) calls with a 500 before taking them.
    fail_next: AtomicU32,
    /// Fail every load (or reload).
    fail_always: std::sync::atomic::AtomicBool,
}

/// A fake sidecar: routes per the datapool, with calls in flight the test sets; each time it is
/// asked, one call ends (so a drain takes several polls).
struct FakeSidecar {
    store: Arc<dyn Store>,
    tenant: TenantId,
    in_flight: Mutex<BTreeMap<String, u64>>,
    log: Arc<Mutex<Vec<String>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response
}

/// vLLM's error body.
fn vllm_error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = json!({"error": {"message": message, "type": "BadRequestError", "param": null,
                                "code": status.as_u16()}});
    text(status, body.to_string())
}

impl Engine {
    fn new(kind: BackendKind, log: &Arc<Mutex<Vec<String>>>) -> Arc<Self> {
        Arc::new(Self {
            kind: Some(kind),
            log: Arc::clone(log),
            ..Self::default()
        })
    }

    fn failing_now(&self) -> bool {
        if self.fail_always.load(Ordering::SeqCst) {
            return true;
        }
        self.fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn answer(&self, path: &str, body: &Value) -> Response<Full<Bytes>> {
        let name = body["lora_name"].as_str().unwrap_or_default().to_owned();
        let sglang = self.kind == Some(BackendKind::Sglang);
        let me = self.kind.map(|k| format!("{k:?}")).unwrap_or_default();
        match path {
            "/v1/load_lora_adapter" | "/load_lora_adapter" => {
                lock(&self.log).push(format!("{me} load {name}"));
                if self.failing_now() {
                    return vllm_error(StatusCode::INTERNAL_SERVER_ERROR, "CUDA out of memory");
                }
                let dir = Path::new(body["lora_path"].as_str().unwrap_or_default());
                if !dir.join("adapter_config.json").is_file() {
                    return vllm_error(StatusCode::BAD_REQUEST, "no adapter_config.json there");
                }
                if !lock(&self.loaded).insert(name.clone()) {
                    return vllm_error(
                        StatusCode::BAD_REQUEST,
                        &format!("The lora adapter '{name}' has already been loaded."),
                    );
                }
                if sglang {
                    text(
                        StatusCode::OK,
                        json!({"success": true, "error_message": null,
                               "loaded_adapters": {name.as_str(): dir.to_string_lossy()}})
                        .to_string(),
                    )
                } else {
                    text(
                        StatusCode::OK,
                        format!("Success: LoRA adapter '{name}' added successfully."),
                    )
                }
            }
            "/v1/unload_lora_adapter" | "/unload_lora_adapter" => {
                lock(&self.log).push(format!("{me} unload {name}"));
                if !lock(&self.loaded).remove(&name) {
                    return vllm_error(
                        StatusCode::NOT_FOUND,
                        &format!("The lora adapter '{name}' cannot be found."),
                    );
                }
                if sglang {
                    text(StatusCode::OK, json!({"success": true}).to_string())
                } else {
                    text(
                        StatusCode::OK,
                        format!("Success: LoRA adapter '{name}' removed successfully."),
                    )
                }
            }
            "/update_weights_from_disk" => {
                let dir = body["model_path"].as_str().unwrap_or_default().to_owned();
                lock(&self.log).push(format!("{me} weights {dir} {}", body["weight_version"]));
                if self.failing_now() {
                    return text(
                        StatusCode::OK,
                        json!({"success": false, "message": "Failed to get weights iterator"})
                            .to_string(),
                    );
                }
                *lock(&self.weights) = Some(dir);
                text(
                    StatusCode::OK,
                    json!({"success": true, "message": "Succeeded to update model weights.",
                           "num_paused_requests": 0})
                    .to_string(),
                )
            }
            _ => vllm_error(StatusCode::NOT_FOUND, "Not Found"),
        }
    }
}

impl FakeSidecar {
    async fn answer(&self) -> Response<Full<Bytes>> {
        let live = self.store.policy_version(&self.tenant).await.ok().flatten();
        let mut in_flight = lock(&self.in_flight);
        let snapshot = in_flight.clone();
        for (adapter, count) in in_flight.iter_mut() {
            if *count > 0 {
                *count -= 1;
                if *count == 0 {
                    lock(&self.log).push(format!("sidecar drained {adapter}"));
                }
            }
        }
        let body = json!({"policies": live.into_iter().collect::<Vec<PolicyVersion>>(),
                          "in_flight": snapshot});
        text(StatusCode::OK, body.to_string())
    }
}

/// Serves `answer` on a loopback port; returns its URL.
async fn serve<F, Fut>(answer: F) -> String
where
    F: Fn(String, Value) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let answer = answer.clone();
                    async move {
                        let path = request.uri().path().to_owned();
                        let body = request
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        Ok::<_, Infallible>(answer(path, body).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

async fn start_engine(engine: &Arc<Engine>) -> String {
    let engine = Arc::clone(engine);
    serve(move |path, body| {
        let engine = Arc::clone(&engine);
        async move { engine.answer(&path, &body) }
    })
    .await
}

async fn start_sidecar(sidecar: &Arc<FakeSidecar>) -> String {
    let sidecar = Arc::clone(sidecar);
    serve(move |_, _| {
        let sidecar = Arc::clone(&sidecar);
        async move { sidecar.answer().await }
    })
    .await
}

fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// A PEFT directory as `LoraAdapter::save` writes it (contents do not matter to the fakes).
fn write_adapter(dir: &Path) -> std::io::Result<()> {
    std::fs::write(
        dir.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "bias": "none"}"#,
    )?;
    std::fs::write(dir.join("adapter_model.safetensors"), b"\0")
}

struct World {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    store: Arc<dyn Store>,
    log: Arc<Mutex<Vec<String>>>,
    vllm: Arc<Engine>,
    sglang: Arc<Engine>,
    sidecar: Arc<FakeSidecar>,
    config: PublishConfig,
}

/// A vLLM and an SGLang backend, a sidecar, the embedded datapool; retries 20 ms apart.
async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("adapters");
    let store: Arc<dyn Store> =
        Arc::new(LocalStore::open(dir.path().join("pool.sqlite3")).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let vllm = Engine::new(BackendKind::Vllm, &log);
    let sglang = Engine::new(BackendKind::Sglang, &log);
    let sidecar = Arc::new(FakeSidecar {
        store: Arc::clone(&store),
        tenant: tenant(),
        in_flight: Mutex::new(BTreeMap::new()),
        log: Arc::clone(&log),
    });
    let mut config = PublishConfig::lora(
        &root,
        vec![
            Backend {
                kind: BackendKind::Vllm,
                url: format!("{}/v1", start_engine(&vllm).await),
                api_key: Some("sk-engine".to_owned()),
            },
            Backend {
                kind: BackendKind::Sglang,
                url: start_engine(&sglang).await,
                api_key: None,
            },
        ],
    );
    config.sidecars = vec![Sidecar {
        url: start_sidecar(&sidecar).await,
        admin_token: "admin".to_owned(),
    }];
    config.retry.backoff = Duration::from_millis(20);
    config.poll_interval = Duration::from_millis(10);
    World {
        _dir: dir,
        root,
        store,
        log,
        vllm,
        sglang,
        sidecar,
        config,
    }
}

impl World {
    fn publisher(&self) -> Publisher {
        Publisher::new(self.config.clone(), Arc::clone(&self.store)).unwrap()
    }

    async fn live(&self) -> Option<u64> {
        self.store
            .policy_version(&tenant())
            .await
            .unwrap()
            .map(|p| p.version)
    }

    fn loaded(&self, engine: &Engine) -> Vec<String> {
        lock(&engine.loaded).iter().cloned().collect()
    }

    fn log(&self) -> Vec<String> {
        lock(&self.log).clone()
    }
}

#[tokio::test]
async fn a_new_version_is_loaded_everywhere_switched_and_the_old_one_unloaded() {
    let world = world().await;
    let publisher = world.publisher();

    let first = publisher
        .publish(&tenant(), 1, write_adapter)
        .await
        .unwrap();
    assert_eq!(first.policy.adapter, "acme@v1");
    assert_eq!(first.previous, None);
    assert!(world.root.join("acme@v1/adapter_config.json").is_file());
    assert_eq!(world.live().await, Some(1));
    assert_eq!(world.loaded(&world.vllm), ["acme@v1"]);
    assert_eq!(world.loaded(&world.sglang), ["acme@v1"]);
    assert_eq!(first.load_attempts, 2);
    assert!(first.not_switched.is_empty());

    let second = publisher
        .publish(&tenant(), 2, write_adapter)
        .await
        .unwrap();
    assert_eq!(second.previous.map(|p| p.version), Some(1));
    assert_eq!(world.live().await, Some(2));
    assert_eq!(world.loaded(&world.vllm), ["acme@v2"]);
    assert_eq!(world.loaded(&world.sglang), ["acme@v2"]);
    assert!(second.unload_failures.is_empty() && second.not_drained.is_empty());
    let t = second.timings;
    assert!(
        t.save + t.load + t.switch + t.drain > Duration::ZERO,
        "{t:?}"
    );
    // No scratch directory is left behind.
    let names: Vec<String> = std::fs::read_dir(&world.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[tokio::test]
async fn the_old_adapter_is_unloaded_only_after_its_calls_drained() {
    let world = world().await;
    let publisher = world.publisher();
    publisher
        .publish(&tenant(), 1, write_adapter)
        .await
        .unwrap();
    lock(&world.sidecar.in_flight).insert("acme@v1".to_owned(), 3);

    let published = publisher
        .publish(&tenant(), 2, write_adapter)
        .await
        .unwrap();
    assert!(published.not_drained.is_empty());
    let log = world.log();
    let drained = log.iter().position(|l| l == "sidecar drained acme@v1");
    let unloaded = log.iter().position(|l| l == "Vllm unload acme@v1");
    assert!(drained.is_some() && unloaded.is_some(), "{log:?}");
    assert!(drained < unloaded, "{log:?}");
}

#[tokio::test]
async fn a_drain_that_does_not_finish_in_time_is_reported_and_the_adapter_unloaded_anyway() {
    let mut world = world().await;
    world.config.drain_timeout = Duration::from_millis(50);
    let publisher = world.publisher();
    publisher
        .publish(&tenant(), 1, write_adapter)
        .await
        .unwrap();
    lock(&world.sidecar.in_flight).insert("acme@v1".to_owned(), 1_000_000);

    let published = publisher
        .publish(&tenant(), 2, write_adapter)
        .await
        .unwrap();
    assert_eq!(
        published.not_drained,
        [world.config.sidecars[0].url.clone()]
    );
    assert_eq!(world.loaded(&world.vllm), ["acme@v2"]);
}

#[tokio::test]
async fn a_load_that_keeps_failing_rolls_back_and_leaves_the_old_version_live() {
    let world = world().await;
    let publisher = world.publisher();
    publisher
        .publish(&tenant(), 1, write_adapter)
        .await
        .unwrap();
    world.sglang.fail_always.store(true, Ordering::SeqCst);

    let failed = publisher.publish(&tenant(), 2, write_adapter).await;
    let Err(PublishError::Load { failures, .. }) = &failed else {
        panic!("expected a load failure, got {failed:?}");
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].attempts, world.config.retry.attempts);
    assert!(failures[0].error.to_string().contains("500"), "{failed:?}");
    // The old version is still live and loaded; the new one is nowhere.
    assert_eq!(world.live().await, Some(1));
    assert_eq!(world.loaded(&world.vllm), ["acme@v1"]);
    assert_eq!(world.loaded(&world.sglang), ["acme@v1"]);
    assert!(world.log().contains(&"Vllm unload acme@v2".to_owned()));

    // Once the backend recovers, the same version publishes.
    world.sglang.fail_always.store(false, Ordering::SeqCst);
    publisher
        .publish(&tenant(), 2, write_adapter)
        .await
        .unwrap();
    assert_eq!(world.live().await, Some(2));
}

#[tokio::test]
async fn a_load_that_fails_a_few_times_is_retried_until_it_succeeds() {
    let world = world().await;
    world.vllm.fail_next.store(2, Ordering::SeqCst);
    let published = world
        .publisher()
        .publish(&tenant(), 1, write_adapter)
        .await
        .unwrap();
    assert_eq!(published.load_attempts, 4);
    assert_eq!(world.loaded(&world.vllm), ["acme@v1"]);
    assert_eq!(world.live().await, Some(1));
}

#[tokio::test]
async fn a_version_not_newer_than_the_live_one_is_refused_before_any_work() {
    let world = world().await;
    let publisher = world.publisher();
    publisher
        .publish(&tenant(), 5, write_adapter)
        .await
        .unwrap();
    let calls = world.log().len();
    for version in [4, 5] {
        let refused = publisher.publish(&tenant(), version, write_adapter).await;
        assert!(
            matches!(refused, Err(PublishError::NotNewer { live: 5, .. })),
            "{refused:?}"
        );
    }
    assert_eq!(world.log().len(), calls);
}

#[tokio::test]
async fn a_writer_that_fails_leaves_nothing_behind() {
    let world = world().await;
    let failed = world
        .publisher()
        .publish(&tenant(), 1, |_: &Path| {
            Err(std::io::Error::other("disk full"))
        })
        .await;
    assert!(
        matches!(failed, Err(PublishError::Save { .. })),
        "{failed:?}"
    );
    assert!(world.log().is_empty());
    assert_eq!(world.live().await, None);
    let left = std::fs::read_dir(&world.root)
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn full_weights_are_reloaded_from_disk_and_rolled_back_where_a_backend_failed() {
    let world = world().await;
    let log = Arc::clone(&world.log);
    let a = Engine::new(BackendKind::Sglang, &log);
    let b = Engine::new(BackendKind::Sglang, &log);
    let mut config = world.config.clone();
    config.mode = Mode::FullWeights {
        served_model: "Qwen/Qwen3-8B".to_owned(),
    };
    config.backends = vec![
        Backend {
            kind: BackendKind::Sglang,
            url: start_engine(&a).await,
            api_key: None,
        },
        Backend {
            kind: BackendKind::Reference,
            url: start_engine(&b).await,
            api_key: None,
        },
    ];
    let publisher = Publisher::new(config, Arc::clone(&world.store)).unwrap();
    let write_weights =
        |dir: &Path| std::fs::write(dir.join("model.safetensors"), b"\0").map(|_| ());

    let first = publisher
        .publish(&tenant(), 1, write_weights)
        .await
        .unwrap();
    assert_eq!(first.policy.adapter, "Qwen/Qwen3-8B");
    let v1 = world.root.join("acme@v1").to_string_lossy().into_owned();
    assert_eq!(lock(&a.weights).as_deref(), Some(v1.as_str()));
    assert!(world.log().contains(&format!("Sglang weights {v1} \"v1\"")));

    b.fail_always.store(true, Ordering::SeqCst);
    let failed = publisher.publish(&tenant(), 2, write_weights).await;
    assert!(
        matches!(failed, Err(PublishError::Load { .. })),
        "{failed:?}"
    );
    assert!(failed
        .unwrap_err()
        .to_string()
        .contains("Failed to get weights iterator"));
    // `a` took v2, then went back to v1.
    assert_eq!(lock(&a.weights).as_deref(), Some(v1.as_str()));
    assert_eq!(world.live().await, Some(1));
}

#[test]
fn vllm_cannot_reload_full_weights_and_the_config_says_so() {
    let mut config = PublishConfig::lora(
        "/tmp/x",
        vec![Backend {
            kind: BackendKind::Vllm,
            url: "http://127.0.0.1:1".to_owned(),
            api_key: None,
        }],
    );
    config.mode = Mode::FullWeights {
        served_model: "m".to_owned(),
    };
    let err = config.check().unwrap_err();
    assert!(err.contains("vLLM"), "{err}");
}
