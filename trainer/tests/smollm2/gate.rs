//! The gate on the real model: SmolLM2's own answers to the shipped retention set
//! (`trainer/gate/retention.jsonl`), checked by the real Wasm plugins (`knows_answer`,
//! `restates_question`). A candidate that answers as the base does is promoted; one that lost
//! the answers is held back, with the reason, and kept on disk with its decision.

use std::path::{Path, PathBuf};

use clawback_datapool::TenantId;
use clawback_filters::FiltersConfig;
use clawback_model::lora::{LoraAdapter, LoraConfig};
use clawback_model::model::{Model, Placement};
use clawback_trainer::gate::{Gate, GateSection, PromptSetConfig};
use clawback_trainer::train::text::TextCodec;
use tch::{Kind, Tensor};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The first `n` prompts of the shipped retention set, in a file of their own: the bound on
/// this test's generations.
fn retention_prompts(dir: &Path, n: usize) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("trainer/gate/retention.jsonl"))
        .expect("the shipped retention set");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .take(n)
        .collect();
    let file = dir.join("retention.jsonl");
    std::fs::write(&file, lines.join("\n")).expect("write the set");
    file
}

fn gate_config(dir: &Path, prompts: PathBuf) -> GateSection {
    let plugins = repo().join("wasm-plugins/target/wasm32-wasip2/release");
    assert!(
        plugins.join("knows_answer.wasm").is_file(),
        "{} has no knows_answer.wasm: scripts/test builds the plugins",
        plugins.display()
    );
    GateSection {
        filters: FiltersConfig {
            dir: Some(plugins),
            reload_interval: std::time::Duration::ZERO,
            ..FiltersConfig::default()
        },
        sets: vec![PromptSetConfig {
            name: "retention".to_owned(),
            file: prompts,
            checks: vec!["knows_answer".to_owned(), "restates_question".to_owned()],
            tenants: Vec::new(),
            max_drop: 1,
            max_drop_from_base: Some(1),
            significance: None,
        }],
        max_new_tokens: 32,
        max_kl: None,
        held_back_dir: Some(dir.join("held-back")),
    }
}

/// An adapter whose B factors are noise of `scale`: the base's answers drowned out.
fn noise(model: &Model, scale: f64) -> LoraAdapter {
    let config = LoraConfig {
        rank: 8,
        alpha: 16.0,
        ..LoraConfig::default()
    };
    let adapter =
        LoraAdapter::new(model.config(), config, model.placement().device).expect("an adapter");
    tch::manual_seed(3);
    let _no_grad = tch::no_grad_guard();
    for (name, mut tensor) in adapter.var_store().variables() {
        if name.contains("lora_B") {
            let noise = Tensor::randn(tensor.size(), (Kind::Float, tensor.device())) * scale;
            tensor.copy_(&noise);
        }
    }
    adapter
}

#[test]
fn a_candidate_that_lost_the_answers_is_held_back_and_one_that_kept_them_goes_live() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model_dir = super::model_dir();
    let model = Model::load(&model_dir, Placement::cpu()).expect("SmolLM2 loads");
    let text = TextCodec::load(&model_dir).expect("SmolLM2's tokenizer and template");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let prompts = retention_prompts(dir.path(), 10);
    let mut gate = Gate::load(gate_config(dir.path(), prompts), &rt, dir.path()).expect("the gate");
    let tenant = TenantId::new("acme").expect("tenant");

    // A fresh adapter (B = 0) is the base itself: it keeps every answer.
    let same = LoraAdapter::new(
        model.config(),
        LoraConfig::default(),
        model.placement().device,
    )
    .expect("an adapter");
    let kept = gate
        .decide(&rt, &model, &text, &tenant, 1, &same, None)
        .expect("judged");
    eprintln!("{}", kept.line());
    let retention = &kept.sets[0];
    assert!(
        retention.base.passed >= 5,
        "SmolLM2 answers most of these: {kept:#?}"
    );
    assert_eq!(retention.candidate, retention.base, "{kept:#?}");
    assert!(kept.promoted, "{kept:#?}");
    assert!(kept.kl.abs() < 1e-6, "the base against itself: {}", kept.kl);

    // The same model with its answers drowned in noise: held back against the live version
    // (v1, whose replies the gate kept when it promoted it) and the base.
    let lost = noise(&model, 0.5);
    let live = Some((1, dir.path().join("no-such-folder")));
    let decision = gate
        .decide(&rt, &model, &text, &tenant, 2, &lost, live)
        .expect("judged");
    eprintln!("{}", decision.line());
    assert!(!decision.promoted, "{decision:#?}");
    assert_eq!(decision.live, Some(1), "{decision:#?}");
    assert!(
        decision.sets[0].candidate.passed + 1 < decision.sets[0].base.passed,
        "{decision:#?}"
    );
    assert!(
        decision.reasons.iter().any(|r| r.starts_with("retention:")),
        "{decision:#?}"
    );
    assert!(decision.kl > 0.1, "{decision:#?}");
    // Only the candidate's replies were read: the base's and v1's were kept.
    assert_eq!(decision.generated, 10, "{decision:#?}");

    let kept_at = gate
        .hold_back(&decision, |dir| lost.save(dir, None))
        .expect("kept for inspection");
    assert!(kept_at.join("adapter_model.safetensors").is_file());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(kept_at.join("gate.json")).expect("gate.json"))
            .expect("JSON");
    assert_eq!(report["promoted"], false);
    assert_eq!(report["version"], 2);
}
