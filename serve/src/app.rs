//! What every handler shares: the tokenizer and chat template of the served model, its
//! config, and the client side of the model worker — submitting a generation, loading and
//! unloading adapters, swapping the base weights.
//!
//! Loading (safetensors from disk) happens on tokio's blocking pool; only the finished
//! weights are handed to the worker, which installs them between two decoding rounds.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use clawback_model::chat_template::ChatTemplate;
use clawback_model::config::ModelConfig;
use clawback_model::generate::SplitMix64;
use clawback_model::lora::LoraAdapter;
use clawback_model::model::{Model, ModelError, Placement};
use clawback_model::tokenizer::Tokenizer;

use super::adapter_roots::{check_name, RuntimeAdapters};
use super::engine::{Command, Event, Job, ModelEntry, Sampling};
use super::error::ServeError;

/// The served model and the way to its worker.
pub struct App {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub config: ModelConfig,
    pub base_name: String,
    /// Token ids that end a reply: the config's EOS ids and the template's `eos_token`.
    pub stop_token_ids: Vec<i64>,
    placement: Placement,
    worker: mpsc::Sender<Command>,
    ids: AtomicU64,
    /// Where runtime loads (the API, the resolver) may read adapters from, and how many.
    runtime: RuntimeAdapters,
}

impl App {
    pub(crate) fn new(
        tokenizer: Tokenizer,
        template: ChatTemplate,
        config: ModelConfig,
        base_name: String,
        placement: Placement,
        worker: mpsc::Sender<Command>,
        runtime: RuntimeAdapters,
    ) -> Self {
        let mut stop_token_ids = config.eos_token_ids.clone();
        if let Some(eos) = &template.special_tokens().eos_token {
            stop_token_ids.extend(tokenizer.token_id(eos));
        }
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        App {
            tokenizer,
            template,
            config,
            base_name,
            stop_token_ids,
            placement,
            worker,
            ids: AtomicU64::new(unix_nanos()),
            runtime,
        }
    }

    fn send(&self, command: Command) -> Result<(), ServeError> {
        self.worker
            .send(command)
            .map_err(|_| ServeError::WorkerGone)
    }

    /// Queues a generation; once the worker has admitted it (the model name resolved), the
    /// tokens arrive on the returned channel. Dropping the channel cancels the request. A
    /// model the worker does not know is looked up in the LoRA resolver directory first.
    pub async fn generate(
        self: &Arc<Self>,
        model: String,
        prompt: Vec<i64>,
        sampling: Sampling,
    ) -> Result<tokio_mpsc::UnboundedReceiver<Event>, ServeError> {
        match self
            .submit(model.clone(), prompt.clone(), sampling.clone())
            .await
        {
            Err(ServeError::ModelNotFound(name)) => match self.resolvable(&name) {
                Some(path) => {
                    match self.load_adapter(name, path).await {
                        // Another request resolved it first.
                        Ok(()) | Err(ServeError::AdapterExists(_)) => {}
                        Err(e) => return Err(e),
                    }
                    self.submit(model, prompt, sampling).await
                }
                None => Err(ServeError::ModelNotFound(name)),
            },
            other => other,
        }
    }

    /// The resolver's folder for `name`: a plain id (never `..`, a path or another spelling of
    /// one) naming a directory with an `adapter_config.json` that is, links resolved, inside
    /// the adapter roots.
    fn resolvable(&self, name: &str) -> Option<PathBuf> {
        let root = self.runtime.resolver_dir.as_ref()?;
        check_name(name).ok()?;
        let dir = self.runtime.roots.resolve(&root.join(name))?;
        dir.join("adapter_config.json").is_file().then_some(dir)
    }

    /// A load asked for over the API: only from the adapter roots, under a plain name.
    pub async fn load_requested_adapter(
        self: &Arc<Self>,
        name: String,
        path: PathBuf,
    ) -> Result<(), ServeError> {
        let path = self.runtime.roots.check(&name, &path)?;
        self.load_adapter(name, path).await
    }

    async fn submit(
        &self,
        model: String,
        prompt: Vec<i64>,
        sampling: Sampling,
    ) -> Result<tokio_mpsc::UnboundedReceiver<Event>, ServeError> {
        let (admitted, admission) = oneshot::channel();
        let (events, receiver) = tokio_mpsc::unbounded_channel();
        self.send(Command::Generate(Job {
            model,
            prompt,
            sampling,
            admitted,
            events,
        }))?;
        admission.await.map_err(|_| ServeError::WorkerGone)??;
        Ok(receiver)
    }

    pub async fn models(&self) -> Result<Vec<ModelEntry>, ServeError> {
        let (reply, listed) = oneshot::channel();
        self.send(Command::List(reply))?;
        listed.await.map_err(|_| ServeError::WorkerGone)
    }

    /// Loads a PEFT adapter from `path` and serves it as `name`, within the cap on loaded
    /// adapters.
    pub async fn load_adapter(
        self: &Arc<Self>,
        name: String,
        path: PathBuf,
    ) -> Result<(), ServeError> {
        let models = self.models().await?;
        if models.iter().any(|m| m.id == name) {
            return Err(ServeError::AdapterExists(name));
        }
        // The base model is one of the entries.
        let loaded = models.len().saturating_sub(1);
        if loaded >= self.runtime.max_loaded {
            return Err(ServeError::TooManyAdapters { loaded });
        }
        let app = Arc::clone(self);
        let dir = path.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            LoraAdapter::load(&dir, &app.config, app.placement.device)
        })
        .await
        .map_err(|e| ServeError::Generation(format!("adapter loading panicked: {e}")))?;
        let adapter = loaded.map_err(|source| ServeError::AdapterLoad {
            name: name.clone(),
            path: path.display().to_string(),
            source: Box::new(source),
        })?;
        let (reply, done) = oneshot::channel();
        self.send(Command::AddAdapter {
            name,
            path,
            adapter,
            reply,
        })?;
        done.await.map_err(|_| ServeError::WorkerGone)?
    }

    pub async fn unload_adapter(&self, name: String) -> Result<(), ServeError> {
        let (reply, done) = oneshot::channel();
        self.send(Command::RemoveAdapter { name, reply })?;
        done.await.map_err(|_| ServeError::WorkerGone)?
    }

    /// Loads full weights from `path` and makes them the base for new requests. The new
    /// checkpoint must have the served model's architecture: loaded adapters, the tokenizer
    /// and the template stay.
    pub async fn update_weights(self: &Arc<Self>, path: PathBuf) -> Result<(), ServeError> {
        let app = Arc::clone(self);
        let dir = path.clone();
        let loaded = tokio::task::spawn_blocking(move || -> Result<Model, ServeError> {
            let weights_error = |source: ModelError| ServeError::WeightsLoad {
                path: dir.display().to_string(),
                source: Box::new(source),
            };
            let config = ModelConfig::from_dir(&dir).map_err(|e| weights_error(e.into()))?;
            if config != app.config {
                return Err(ServeError::IncompatibleWeights {
                    path: dir.display().to_string(),
                    detail: format!(
                        "its config.json describes {}, the served model is {}",
                        describe(&config),
                        describe(&app.config)
                    ),
                });
            }
            Model::load(&dir, app.placement).map_err(weights_error)
        })
        .await
        .map_err(|e| ServeError::Generation(format!("weight loading panicked: {e}")))?;
        let model = loaded?;
        let (reply, done) = oneshot::channel();
        self.send(Command::SwapWeights {
            model: Box::new(model),
            path,
            reply,
        })?;
        done.await.map_err(|_| ServeError::WorkerGone)
    }

    /// A fresh id of 32 hex digits for a completion or tool call, as vLLM's `random_uuid()`.
    pub fn random_id(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut rng = SplitMix64(n);
        format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64())
    }

    /// A seed for a request that did not bring one.
    pub fn random_seed(&self) -> u64 {
        SplitMix64(self.ids.fetch_add(1, Ordering::Relaxed) ^ 0x5eed).next_u64()
    }
}

fn describe(c: &ModelConfig) -> String {
    format!(
        "{:?} with {} layers, hidden size {}, vocabulary {}",
        c.family, c.num_layers, c.hidden_size, c.vocab_size
    )
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Seconds since the epoch, for `created`.
pub fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
