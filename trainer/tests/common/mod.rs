//! Shared by the training-loop tests: a tiny random HF model folder made on the spot, recorded
//! trajectories in the datapool's real schema (the schema example's steps, with ids mapped into
//! the tiny vocabulary), and a look at what the trainer left on disk.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clawback_datapool::example::tool_use_trajectory;
use clawback_datapool::{
    Complete, CompletionReason, Consumer, ConsumerName, Evaluation, EvaluationId, EvaluationSource,
    GroupId, Step, StepId, Store, TenantId, Tokens, Trajectory, TrajectoryId, UnixMs, Verdict,
    SCHEMA_VERSION,
};
use clawback_trainer::train::checkpoint::{read_state, CheckpointState};
use tch::{Kind, Tensor};

pub const VOCAB: i64 = 64;

/// Writes a tiny Llama-shaped model (config.json + model.safetensors, random weights) into
/// `dir`: what `Model::load` reads from a real HF folder.
pub fn tiny_model_dir(dir: &Path) -> PathBuf {
    let (hidden, inter, layers, heads, kv_heads) = (32i64, 64i64, 2, 4i64, 2i64);
    let head_dim = hidden / heads;
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": VOCAB, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "tie_word_embeddings": true, "rms_norm_eps": 1e-6
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap_or_else(|e| panic!("{e}"));
    tch::manual_seed(11);
    let randn = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)) * 0.15;
    let mut named: Vec<(String, Tensor)> = vec![
        ("model.embed_tokens.weight".into(), randn(&[VOCAB, hidden])),
        (
            "model.norm.weight".into(),
            Tensor::ones([hidden], (Kind::Float, tch::Device::Cpu)),
        ),
    ];
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let ones = || Tensor::ones([hidden], (Kind::Float, tch::Device::Cpu));
        named.push((format!("{p}.input_layernorm.weight"), ones()));
        named.push((format!("{p}.post_attention_layernorm.weight"), ones()));
        named.push((
            format!("{p}.self_attn.q_proj.weight"),
            randn(&[heads * head_dim, hidden]),
        ));
        named.push((
            format!("{p}.self_attn.k_proj.weight"),
            randn(&[kv_heads * head_dim, hidden]),
        ));
        named.push((
            format!("{p}.self_attn.v_proj.weight"),
            randn(&[kv_heads * head_dim, hidden]),
        ));
        named.push((
            format!("{p}.self_attn.o_proj.weight"),
            randn(&[hidden, heads * head_dim]),
        ));
        named.push((format!("{p}.mlp.gate_proj.weight"), randn(&[inter, hidden])));
        named.push((format!("{p}.mlp.up_proj.weight"), randn(&[inter, hidden])));
        named.push((format!("{p}.mlp.down_proj.weight"), randn(&[hidden, inter])));
    }
    let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&refs, dir.join("model.safetensors"))
        .unwrap_or_else(|e| panic!("{e}"));
    dir.to_path_buf()
}

/// A recorded trajectory's steps: the schema example's two turns (engine ids, logprobs,
/// messages, next states), with fresh ids and every token id mapped into the tiny vocabulary
/// (the mapping keeps the second prompt an extension of the first turn, so they merge).
/// `variant` shifts the completion ids so rollouts of one group differ.
pub fn recorded_steps(tenant: &TenantId, trajectory: TrajectoryId, variant: u32) -> Vec<Step> {
    let mut steps = tool_use_trajectory(tenant.clone()).steps;
    for step in &mut steps {
        step.id = StepId::new();
        step.trajectory = trajectory;
        step.policy = None;
        if let Tokens::Engine(e) = &mut step.tokens {
            let map = |id: &mut u32| *id %= VOCAB as u32;
            e.prompt_token_ids.iter_mut().for_each(map);
            e.completion_token_ids
                .iter_mut()
                .for_each(|id| *id = (*id + variant) % VOCAB as u32);
        }
    }
    // Keep the merge: the second prompt starts with the first prompt and completion.
    if let [first, second] = &mut steps[..] {
        if let (Tokens::Engine(a), Tokens::Engine(b)) = (&first.tokens, &mut second.tokens) {
            let done = a.prompt_token_ids.len() + a.completion_token_ids.len();
            let mut prompt = [&a.prompt_token_ids[..], &a.completion_token_ids[..]].concat();
            prompt.extend_from_slice(&b.prompt_token_ids[done.min(b.prompt_token_ids.len())..]);
            b.prompt_token_ids = prompt;
        }
    }
    steps
}

pub fn plugin_score(
    tenant: &TenantId,
    trajectory: TrajectoryId,
    step: Option<StepId>,
    plugin: &str,
    reward: Option<f64>,
    hint: Option<&str>,
) -> Evaluation {
    Evaluation {
        schema_version: SCHEMA_VERSION,
        id: EvaluationId::new(),
        tenant: tenant.clone(),
        trajectory,
        step,
        source: EvaluationSource::Plugin {
            name: plugin.into(),
            content_hash: "sha256:7a1f".into(),
        },
        verdict: Verdict::Score {
            reward,
            hint: hint.map(str::to_owned),
        },
        labels: BTreeMap::new(),
        created_at: UnixMs::now(),
    }
}

pub fn filter_error(tenant: &TenantId, trajectory: TrajectoryId, step: StepId) -> Evaluation {
    Evaluation {
        verdict: Verdict::FilterError {
            reason: "plugin trapped: fuel exhausted".into(),
        },
        ..plugin_score(tenant, trajectory, Some(step), "judge", None, None)
    }
}

pub fn feedback(tenant: &TenantId, trajectory: TrajectoryId, reward: f64) -> Evaluation {
    Evaluation {
        source: EvaluationSource::Feedback {
            channel: "handshake".into(),
        },
        ..plugin_score(tenant, trajectory, None, "-", Some(reward), None)
    }
}

/// What was recorded, to check the trainer against.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Every trainable step id.
    pub steps: Vec<StepId>,
    pub ready_entries: usize,
}

/// Records `groups` groups of `group_size` rollouts (each scored by a plugin on its first step,
/// with rewards that differ within the group, plus a filter error) and `singles` single
/// trajectories (a thumbs-up or -down as outcome, and a hint), completes them all, so the ready
/// queue holds `groups + singles` entries.
pub async fn record(
    store: &dyn Store,
    tenant: &TenantId,
    groups: usize,
    group_size: u32,
    singles: usize,
) -> Recorded {
    let mut out = Recorded::default();
    let mut write = |traj: Trajectory, variant: u32, evals: &dyn Fn(&[Step]) -> Vec<Evaluation>| {
        let steps = recorded_steps(tenant, traj.id, variant);
        out.steps.extend(steps.iter().map(|s| s.id));
        let evaluations = evals(&steps);
        (traj, steps, evaluations)
    };
    let mut batches = Vec::new();
    for g in 0..groups {
        let group = GroupId::new();
        for r in 0..group_size {
            let traj =
                Trajectory::open(tenant.clone(), TrajectoryId::new()).in_group(group, group_size);
            let id = traj.id;
            let reward = f64::from(r) / f64::from(group_size.max(1));
            batches.push(write(traj, g as u32 * 7 + r, &|steps: &[Step]| {
                vec![
                    plugin_score(
                        tenant,
                        id,
                        Some(steps[0].id),
                        "tool-success",
                        Some(reward),
                        None,
                    ),
                    filter_error(tenant, id, steps[1].id),
                ]
            }));
        }
    }
    for s in 0..singles {
        let traj = Trajectory::open(tenant.clone(), TrajectoryId::new());
        let id = traj.id;
        let thumb = if s % 2 == 0 { 1.0 } else { -1.0 };
        batches.push(write(traj, 3 + s as u32, &|steps: &[Step]| {
            vec![
                feedback(tenant, id, thumb),
                plugin_score(
                    tenant,
                    id,
                    Some(steps[1].id),
                    "opd-hint",
                    None,
                    Some("Mention the umbrella."),
                ),
            ]
        }));
    }
    for (traj, steps, evaluations) in batches {
        write_trajectory(store, &traj, &steps, &evaluations).await;
    }
    out.ready_entries = groups + singles;
    out
}

/// Records `count` single trajectories whose steps `version` served, each rewarded `reward` by
/// its user (the outcome).
pub async fn record_served(
    store: &dyn Store,
    tenant: &TenantId,
    version: u64,
    reward: f64,
    count: usize,
) {
    for n in 0..count {
        let traj = Trajectory::open(tenant.clone(), TrajectoryId::new());
        let mut steps = recorded_steps(tenant, traj.id, 11 + n as u32);
        for step in &mut steps {
            step.policy = Some(clawback_datapool::PolicyRef {
                adapter: format!("{tenant}@v{version}"),
                version,
            });
        }
        let evaluations = [feedback(tenant, traj.id, reward)];
        write_trajectory(store, &traj, &steps, &evaluations).await;
    }
}

/// Stores a trajectory with its steps and evaluations, and completes it (enqueueing it, or
/// its group once every member is complete).
pub async fn write_trajectory(
    store: &dyn Store,
    traj: &Trajectory,
    steps: &[Step],
    evaluations: &[Evaluation],
) {
    let done = async {
        store.upsert_trajectory(traj).await?;
        store.append_steps(steps).await?;
        store.append_evaluations(evaluations).await?;
        let complete = Complete::now(traj.tenant.clone(), traj.id, CompletionReason::Handshake);
        store.complete_trajectory(&complete).await
    };
    done.await.unwrap_or_else(|e| panic!("{e}"));
}

/// Entries still unacked in `group`: a member with a zero idle time takes over every pending one.
pub async fn unacked(store: &dyn Store, tenant: &TenantId, group: &str) -> usize {
    let name = |s: &str| ConsumerName::new(s).unwrap_or_else(|e| panic!("{e}"));
    let mut probe = Consumer::new(name(group), name("probe"));
    probe.claim_idle = std::time::Duration::ZERO;
    probe.max_deliveries = u32::MAX;
    store
        .read_ready(tenant, &probe, 1000)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .len()
}

/// Every checkpoint of `tenant` under `root`, oldest first.
pub fn checkpoints(root: &Path, tenant: &TenantId) -> Vec<(PathBuf, CheckpointState)> {
    let dir = root.join(tenant.as_str());
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, CheckpointState)> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-"))
        })
        .filter_map(|p| read_state(&p).ok().map(|s| (p, s.state)))
        .collect();
    out.sort_by_key(|(_, s)| s.optimizer_steps);
    out
}

/// A fresh tenant id no other test or run uses.
pub fn fresh_tenant(label: &str) -> TenantId {
    let suffix = uuid::Uuid::now_v7().simple().to_string();
    TenantId::new(format!("train-{label}-{}", &suffix[suffix.len() - 12..]))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Gives the model folder a word-level tokenizer (every word it does not know is `[UNK]`) and a
/// ChatML-like template, so text-only steps can be re-tokenised and hints distilled.
pub fn add_tokenizer(dir: &Path) {
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true})
    };
    let mut vocab = serde_json::Map::new();
    let words = [
        "[UNK]",
        "<|im_end|>",
        "<|im_start|>",
        "system",
        "user",
        "assistant",
        "tool",
        "the",
        "weather",
        "in",
        "Paris",
        "umbrella",
        "Mention",
        ".",
        "?",
        ",",
        "'",
        "s",
        "It",
        "light",
        "rain",
        "Celsius",
        "Answer",
        "now",
        "right",
        "What",
    ];
    for (id, w) in words.iter().enumerate() {
        vocab.insert((*w).to_owned(), serde_json::json!(id));
    }
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(1, "<|im_end|>"), special(2, "<|im_start|>")],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let template = "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|> \
                    {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}";
    let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
}
