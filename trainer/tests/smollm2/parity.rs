//! The trainer against transformers and peft on the real model: the same logits over real
//! conversations, the same text and ids from the chat template and tokenizer, and LoRA adapters
//! that mean the same thing on both sides, whichever wrote them.
//!
//! Tolerance: measured here, the trainer's logits are bit for bit transformers' (0.0 apart,
//! adapters from either side included): tch runs the venv's own libtorch and the decoder does
//! the modules' operations in their order. The bounds — 1e-3 on logits of magnitude ~30, 2e-4
//! on the log-probabilities of the reply's tokens — leave room for what another kernel order
//! costs in f32 over 30 layers (another transformers release, another attention path); a wrong
//! weight, rope base, norm epsilon or template token moves logits by whole units.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use clawback_model::chat_template::{ChatInput, ChatTemplate};
use clawback_model::lora::{LoraAdapter, LoraConfig, Target};
use clawback_model::model::{Model, Placement};
use clawback_model::test_support::random_adapter;
use clawback_model::tokenizer::Tokenizer;
use serde_json::Value;
use tch::{Kind, Tensor};

use super::model_dir;

const LOGIT_TOLERANCE: f64 = 1e-3;
const LOGPROB_TOLERANCE: f64 = 2e-4;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CLAWBACK_TORCH_PYTHON") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("CLAWBACK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/clawback")
        });
    cache.join("torch-venv/bin/python")
}

fn run_reference(args: &[&Path]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smollm2/reference.py");
    let out = Command::new(python())
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("running reference.py (scripts/ensure-torch makes its venv): {e}")
        });
    assert!(
        out.status.success(),
        "reference.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What transformers and peft said, once per test run.
fn reference() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-reference");
        let _ = std::fs::remove_dir_all(&dir);
        run_reference(&[Path::new("cases"), &model_dir(), &dir]);
        dir
    })
}

fn tensor(file: &Path, name: &str) -> Tensor {
    Tensor::read_safetensors(file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{} has no {name}", file.display()))
        .1
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// The log-probability of each next token of `ids` under `logits`.
fn token_logprobs(logits: &Tensor, ids: &Tensor) -> Tensor {
    let n = ids.size()[1];
    let next = ids.narrow(1, 1, n - 1);
    logits
        .narrow(1, 0, n - 1)
        .log_softmax(-1, Kind::Double)
        .gather(-1, &next.unsqueeze(-1), false)
        .squeeze_dim(-1)
}

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(reference().join("cases.json")).expect("cases.json");
    serde_json::from_str(&text).expect("cases.json is JSON")
}

fn model() -> Model {
    Model::load(&model_dir(), Placement::cpu()).expect("the trainer loads SmolLM2")
}

#[test]
fn the_trainers_logits_over_real_conversations_are_transformers() {
    let model = model();
    for (i, case) in cases().iter().enumerate() {
        let file = reference().join(format!("case-{i}.safetensors"));
        let ids = tensor(&file, "input_ids");
        let want = tensor(&file, "logits");
        let ours = tch::no_grad(|| model.forward(&ids, None, false).expect("a forward pass"));
        let logits = max_abs_diff(&ours, &want);
        let logprobs = max_abs_diff(&token_logprobs(&ours, &ids), &token_logprobs(&want, &ids));
        println!(
            "{}: {} tokens, max |Δ logit| {logits:.2e}, max |Δ logprob| of its tokens {logprobs:.2e}",
            case["name"],
            ids.size()[1]
        );
        assert!(logits <= LOGIT_TOLERANCE, "{}: {logits}", case["name"]);
        assert!(
            logprobs <= LOGPROB_TOLERANCE,
            "{}: {logprobs}",
            case["name"]
        );
    }
}

#[test]
fn the_chat_template_and_tokenizer_give_transformers_text_and_ids() {
    let dir = model_dir();
    let template = ChatTemplate::from_dir(&dir).expect("SmolLM2's template");
    let tokenizer = Tokenizer::from_dir(&dir).expect("SmolLM2's tokenizer");
    for case in cases() {
        let messages = case["messages"].as_array().expect("messages");
        let render = |messages: &[Value], add_generation_prompt: bool| {
            template
                .render(ChatInput {
                    messages,
                    tools: None,
                    add_generation_prompt,
                    extra: None,
                })
                .expect("a render")
        };
        let text = render(messages, false);
        assert_eq!(
            text,
            case["text"].as_str().expect("text"),
            "{}",
            case["name"]
        );
        // What the engine sees when the agent asks for the last reply.
        let prompt = render(&messages[..messages.len() - 1], true);
        assert_eq!(
            prompt,
            case["prompt"].as_str().expect("prompt"),
            "{}",
            case["name"]
        );
        let ids = tokenizer.encode(&text, false).expect("ids");
        let want: Vec<i64> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .filter_map(Value::as_i64)
            .collect();
        assert_eq!(ids, want, "{}", case["name"]);
        assert_eq!(tokenizer.decode(&ids, false).expect("text"), text);
    }
}

#[test]
fn an_adapter_peft_wrote_for_the_real_model_gives_peft_logits() {
    let model = model();
    let dir = reference().join("peft-adapter");
    let adapter = LoraAdapter::load(&dir, model.config(), tch::Device::Cpu).expect("the adapter");
    let file = dir.join("reference.safetensors");
    let ids = tensor(&file, "input_ids");
    let ours = tch::no_grad(|| model.forward(&ids, Some(&adapter), false).expect("forward"));
    let base = tch::no_grad(|| model.forward(&ids, None, false).expect("forward"));
    let moved = max_abs_diff(&ours, &base);
    let diff = max_abs_diff(&ours, &tensor(&file, "logits"));
    println!(
        "peft's adapter: moves logits by up to {moved:.2}, ours differ from peft's by {diff:.2e}"
    );
    assert!(moved > 0.1, "the adapter changes nothing: {moved}");
    assert!(diff <= LOGIT_TOLERANCE, "{diff}");
}

#[test]
fn an_adapter_the_trainer_saves_gives_its_logits_through_peft() {
    let model = model();
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-our-adapter");
    let _ = std::fs::remove_dir_all(&work);
    let config = LoraConfig {
        rank: 16,
        alpha: 32.0,
        dropout: 0.0,
        targets: Target::ALL.to_vec(),
        use_rslora: false,
    };
    let adapter = random_adapter(model.config(), config, 5, 0.02);
    let adapter_dir = work.join("adapter");
    adapter
        .save(&adapter_dir, model_dir().to_str())
        .expect("the adapter saves");
    let ids_file = reference().join("case-1.safetensors");
    let ids = tensor(&ids_file, "input_ids");
    let ours = tch::no_grad(|| model.forward(&ids, Some(&adapter), false).expect("forward"));
    let out = work.join("peft.safetensors");
    let jobs = work.join("jobs.json");
    let job = serde_json::json!([{"adapter": adapter_dir, "ids": ids_file, "out": out}]);
    std::fs::write(&jobs, job.to_string()).expect("jobs.json");
    run_reference(&[Path::new("lora"), &model_dir(), &jobs]);
    let diff = max_abs_diff(&ours, &tensor(&out, "logits"));
    println!("our adapter through PeftModel.from_pretrained: max |Δ logit| {diff:.2e}");
    assert!(diff <= LOGIT_TOLERANCE, "{diff}");
}
