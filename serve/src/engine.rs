//! The model worker: one OS thread owns the weights, the adapters and every sequence's KV
//! cache (tch tensors stay on the thread that uses them), and the HTTP side talks to it
//! through a command channel.
//!
//! Sequences are decoded interleaved, one token per running sequence per round, so
//! concurrent streams make progress together (no batched decoding: each step is its own
//! forward pass). Commands are taken between rounds. A sequence holds its own handles to the
//! weights and adapter it was admitted with, so a load, unload or weight swap changes what
//! new requests get and never what a running one is generating with.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::mpsc;

use tch::Tensor;
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use clawback_model::generate::{self, FinishReason, SplitMix64};
use clawback_model::kv_cache::KvCache;
use clawback_model::lora::LoraAdapter;
use clawback_model::model::Model;

use super::error::ServeError;

/// How to sample one request's tokens.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub temperature: f64,
    pub top_p: f64,
    pub seed: u64,
    pub max_tokens: usize,
    pub stop_token_ids: Vec<i64>,
    /// How many of the most likely alternatives to report with each token.
    pub top_logprobs: usize,
}

/// A generated token with its raw log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub id: i64,
    pub logprob: f64,
    pub top: Vec<(i64, f64)>,
}

/// What the worker reports about a running request.
#[derive(Debug)]
pub enum Event {
    Token(SampledToken),
    Finished(FinishReason),
    Failed(String),
}

/// One generation request: which model (the base or a LoRA name), the prompt, and where the
/// tokens go. The request is cancelled when `events` is dropped.
#[derive(Debug)]
pub struct Job {
    pub model: String,
    pub prompt: Vec<i64>,
    pub sampling: Sampling,
    pub admitted: oneshot::Sender<Result<(), ServeError>>,
    pub events: tokio_mpsc::UnboundedSender<Event>,
}

/// A model a request can name, as `/v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEntry {
    pub id: String,
    pub root: String,
    /// The base model's name for an adapter, None for the base itself.
    pub parent: Option<String>,
}

pub(crate) enum Command {
    Generate(Job),
    AddAdapter {
        name: String,
        path: PathBuf,
        adapter: LoraAdapter,
        reply: oneshot::Sender<Result<(), ServeError>>,
    },
    RemoveAdapter {
        name: String,
        reply: oneshot::Sender<Result<(), ServeError>>,
    },
    SwapWeights {
        model: Box<Model>,
        path: PathBuf,
        reply: oneshot::Sender<()>,
    },
    List(oneshot::Sender<Vec<ModelEntry>>),
}

struct Installed {
    name: String,
    path: PathBuf,
    adapter: Rc<LoraAdapter>,
}

/// A request being decoded, with the weights it was admitted with.
struct Sequence {
    model: Rc<Model>,
    adapter: Option<Rc<LoraAdapter>>,
    cache: KvCache,
    /// The prompt before the first step, then the last sampled token.
    input: Vec<i64>,
    generated: usize,
    sampling: Sampling,
    rng: SplitMix64,
    events: tokio_mpsc::UnboundedSender<Event>,
}

/// The worker's state: what new requests get, and what is running.
struct Worker {
    base_name: String,
    base_path: PathBuf,
    model: Rc<Model>,
    adapters: Vec<Installed>,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    max_running: usize,
}

/// Starts the worker thread with `model` served as `base_name`. The thread ends when every
/// sender of the returned channel is gone.
pub(crate) fn spawn(
    model: Model,
    base_name: String,
    base_path: PathBuf,
    max_running: usize,
) -> std::io::Result<mpsc::Sender<Command>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("serve-model".to_owned())
        .spawn(move || {
            let _no_grad = tch::no_grad_guard();
            let mut worker = Worker {
                base_name,
                base_path,
                model: Rc::new(model),
                adapters: Vec::new(),
                waiting: VecDeque::new(),
                running: Vec::new(),
                max_running: max_running.max(1),
            };
            worker.run(&rx);
        })?;
    Ok(tx)
}

impl Worker {
    fn run(&mut self, commands: &mpsc::Receiver<Command>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match commands.recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                    // Finish what is running; nobody can send new work.
                    Err(mpsc::TryRecvError::Disconnected) => break,
                }
            }
            while self.running.len() < self.max_running {
                match self.waiting.pop_front() {
                    Some(sequence) => self.running.push(sequence),
                    None => break,
                }
            }
            self.running.retain_mut(|sequence| sequence.step());
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Generate(job) => self.admit(job),
            Command::AddAdapter {
                name,
                path,
                adapter,
                reply,
            } => {
                let result = if self.knows(&name) {
                    Err(ServeError::AdapterExists(name))
                } else {
                    self.adapters.push(Installed {
                        name,
                        path,
                        adapter: Rc::new(adapter),
                    });
                    Ok(())
                };
                let _ = reply.send(result);
            }
            Command::RemoveAdapter { name, reply } => {
                let before = self.adapters.len();
                self.adapters.retain(|a| a.name != name);
                let result = if self.adapters.len() < before {
                    Ok(())
                } else {
                    Err(ServeError::AdapterNotFound(name))
                };
                let _ = reply.send(result);
            }
            Command::SwapWeights { model, path, reply } => {
                self.model = Rc::new(*model);
                self.base_path = path;
                let _ = reply.send(());
            }
            Command::List(reply) => {
                let mut entries = vec![ModelEntry {
                    id: self.base_name.clone(),
                    root: self.base_path.display().to_string(),
                    parent: None,
                }];
                entries.extend(self.adapters.iter().map(|a| ModelEntry {
                    id: a.name.clone(),
                    root: a.path.display().to_string(),
                    parent: Some(self.base_name.clone()),
                }));
                let _ = reply.send(entries);
            }
        }
    }

    fn knows(&self, name: &str) -> bool {
        name == self.base_name || self.adapters.iter().any(|a| a.name == name)
    }

    /// Resolves the request's model now, so that it runs on today's weights and adapter
    /// whatever is swapped while it waits or runs.
    fn admit(&mut self, job: Job) {
        let adapter = if job.model == self.base_name {
            None
        } else {
            match self.adapters.iter().find(|a| a.name == job.model) {
                Some(installed) => Some(Rc::clone(&installed.adapter)),
                None => {
                    let _ = job.admitted.send(Err(ServeError::ModelNotFound(job.model)));
                    return;
                }
            }
        };
        if job.admitted.send(Ok(())).is_err() {
            return;
        }
        self.waiting.push_back(Sequence {
            cache: self.model.new_cache(),
            model: Rc::clone(&self.model),
            adapter,
            input: job.prompt,
            generated: 0,
            rng: SplitMix64(job.sampling.seed),
            sampling: job.sampling,
            events: job.events,
        });
    }
}

impl Sequence {
    /// Runs one forward pass and reports its token; false once the sequence is over (done,
    /// failed, or nobody listening any more).
    fn step(&mut self) -> bool {
        if self.events.is_closed() {
            return false;
        }
        if self.generated >= self.sampling.max_tokens {
            let _ = self.events.send(Event::Finished(FinishReason::Length));
            return false;
        }
        let token = match self.next_token() {
            Ok(token) => token,
            Err(message) => {
                let _ = self.events.send(Event::Failed(message));
                return false;
            }
        };
        let id = token.id;
        self.generated += 1;
        self.input = vec![id];
        if self.events.send(Event::Token(token)).is_err() {
            return false;
        }
        let finish = if self.sampling.stop_token_ids.contains(&id) {
            Some(FinishReason::Stop)
        } else if self.generated >= self.sampling.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        match finish {
            Some(reason) => {
                let _ = self.events.send(Event::Finished(reason));
                false
            }
            None => true,
        }
    }

    fn next_token(&mut self) -> Result<SampledToken, String> {
        let input = Tensor::from_slice(&self.input).unsqueeze(0);
        let logits = self
            .model
            .forward_cached(&input, self.adapter.as_deref(), &mut self.cache)
            .map_err(|e| e.to_string())?;
        let last = generate::last_position(&logits).map_err(|e| e.to_string())?;
        let s = &self.sampling;
        let next = if s.temperature <= 0.0 {
            generate::argmax(&last)
        } else {
            generate::sample(&last, s.temperature, s.top_p, &mut self.rng)
        };
        let logprob = generate::log_softmax_at(&last, next);
        // log Σ exp(l) follows from one log-softmax value; every other logprob is l − that.
        let log_total = f64::from(last[next]) - logprob;
        let top = top_k(&last, s.top_logprobs)
            .into_iter()
            .map(|i| {
                // The sampled token's entry repeats its own value, not a rounding of it.
                let lp = if i == next {
                    logprob
                } else {
                    f64::from(last[i]) - log_total
                };
                (i as i64, lp)
            })
            .collect();
        Ok(SampledToken {
            id: next as i64,
            logprob,
            top,
        })
    }
}

/// Indices of the `k` largest logits, largest first (ties by lower id).
fn top_k(logits: &[f32], k: usize) -> Vec<usize> {
    if k == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let k = k.min(order.len());
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_logit);
        order.truncate(k);
    }
    order.sort_by(by_logit);
    order
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_picks_the_largest_logits_in_order() {
        assert_eq!(top_k(&[0.1, 3.0, -1.0, 2.0, 3.0], 3), vec![1, 4, 3]);
        assert_eq!(top_k(&[1.0, 2.0], 5), vec![1, 0]);
        assert!(top_k(&[1.0], 0).is_empty());
    }
}
