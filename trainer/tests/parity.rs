//! Parity with the Python reference stack: tiny random Llama, Qwen2 and Qwen3 models made
//! by transformers, adapters made by peft or by us and read back by peft, and chat templates
//! rendered by `apply_chat_template` must all give what our code gives.
//!
//! `parity/fixtures.py` creates everything at test time (nothing is downloaded) with the
//! python of the venv that `scripts/ensure-torch` sets up, or `CLAWBACK_TORCH_PYTHON`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use clawback_model::chat_template::{ChatInput, ChatTemplate};
use clawback_model::generate::{generate, SamplingParams};
use clawback_model::lora::{LoraAdapter, LoraConfig, Target};
use clawback_model::model::{Model, Placement};
use clawback_model::tokenizer::Tokenizer;
use serde_json::Value;
use tch::{Kind, Tensor};

const TOLERANCE: f64 = 1e-4;
const FAMILIES: [&str; 3] = ["llama", "qwen2", "qwen3"];

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CLAWBACK_TORCH_PYTHON") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("CLAWBACK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/clawback")
        });
    cache.join("torch-venv/bin/python")
}

fn run_fixtures(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parity/fixtures.py");
    let python = python();
    let out = Command::new(&python)
        .arg(&script)
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (run scripts/ensure-torch): {e}",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "fixtures.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The reference models, adapters and renders, made once per test run.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Tiny models gain nothing from more threads; on a busy machine they lose a lot.
        tch::set_num_threads(1);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parity-fixtures");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        run_fixtures(&["models", dir.to_str().unwrap()]);
        dir
    })
}

fn reference(path: &Path, name: &str) -> Tensor {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{} has no {name}", path.display()))
        .1
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

fn assert_logits_match(family: &str) {
    let dir = fixtures().join(family);
    let model = Model::load(&dir, Placement::cpu()).unwrap();
    let reference_file = dir.join("reference.safetensors");
    let ids = reference(&reference_file, "input_ids");
    let ours = tch::no_grad(|| model.forward(&ids, None, false).unwrap());
    let diff = max_abs_diff(&ours, &reference(&reference_file, "logits"));
    println!("{family}: max |logits - transformers| = {diff:.3e}");
    assert!(diff <= TOLERANCE, "{family}: max abs diff {diff}");
}

#[test]
fn llama_from_a_sharded_checkpoint_matches_transformers() {
    assert_logits_match("llama");
}

#[test]
fn qwen2_with_biases_and_tied_embeddings_matches_transformers() {
    assert_logits_match("qwen2");
}

#[test]
fn qwen3_with_qk_norms_matches_transformers() {
    assert_logits_match("qwen3");
}

#[test]
fn bf16_weights_stay_close_to_the_f32_reference() {
    // The CUDA placement's dtype, run on the CPU: exercises every cast (norms in f32,
    // rope tables, the f32 LoRA delta) without a GPU.
    let dir = fixtures().join("qwen3");
    let placement = Placement {
        device: tch::Device::Cpu,
        kind: Kind::BFloat16,
    };
    let model = Model::load(&dir, placement).unwrap();
    let reference_file = dir.join("reference.safetensors");
    let ids = reference(&reference_file, "input_ids");
    let adapter = LoraAdapter::load(
        &fixtures().join("qwen3-peft-adapter"),
        model.config(),
        tch::Device::Cpu,
    )
    .unwrap();
    let ours = tch::no_grad(|| model.forward(&ids, None, false).unwrap());
    assert_eq!(ours.kind(), Kind::BFloat16);
    let want = reference(&reference_file, "logits");
    let diff = max_abs_diff(&ours, &want);
    let scale = want.abs().max().double_value(&[]);
    println!("qwen3 in bf16: max diff {diff:.3e} on logits up to {scale:.2}");
    assert!(
        diff < 0.05 * scale,
        "bf16 drifted: {diff} on a scale of {scale}"
    );
    let adapted = tch::no_grad(|| model.forward(&ids, Some(&adapter), false).unwrap());
    assert_eq!(adapted.kind(), Kind::BFloat16);
}

#[test]
fn greedy_generation_with_the_kv_cache_matches_transformers_generate() {
    for family in FAMILIES {
        let dir = fixtures().join(family);
        let model = Model::load(&dir, Placement::cpu()).unwrap();
        let greedy: Vec<i64> =
            Vec::try_from(&reference(&dir.join("reference.safetensors"), "greedy")).unwrap();
        let (prompt, completion) = greedy.split_at(6);
        let params = SamplingParams {
            max_new_tokens: completion.len(),
            ..SamplingParams::default()
        };
        let ours = generate(&model, None, prompt, &params).unwrap();
        assert_eq!(ours.token_ids, completion, "{family}");
    }
}

#[test]
fn an_adapter_written_by_peft_gives_peft_logits() {
    let dir = fixtures();
    let model = Model::load(&dir.join("qwen3"), Placement::cpu()).unwrap();
    let adapter_dir = dir.join("qwen3-peft-adapter");
    let adapter = LoraAdapter::load(&adapter_dir, model.config(), tch::Device::Cpu).unwrap();
    assert!(adapter.config().use_rslora);
    let reference_file = adapter_dir.join("reference.safetensors");
    let ids = reference(&reference_file, "input_ids");
    let ours = tch::no_grad(|| model.forward(&ids, Some(&adapter), false).unwrap());
    let base = tch::no_grad(|| model.forward(&ids, None, false).unwrap());
    assert!(
        max_abs_diff(&ours, &base) > 1e-2,
        "the adapter changes nothing"
    );
    let diff = max_abs_diff(&ours, &reference(&reference_file, "logits"));
    println!("qwen3 + peft-made rsLoRA adapter: max diff {diff:.3e}");
    assert!(diff <= TOLERANCE, "max abs diff {diff}");
}

#[test]
fn adapters_we_save_load_in_peft_and_give_our_logits() {
    let dir = fixtures();
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parity-our-adapters");
    let _ = std::fs::remove_dir_all(&work);
    let mut jobs = Vec::new();
    let mut ours = Vec::new();
    for (i, family) in FAMILIES.iter().enumerate() {
        let model_dir = dir.join(family);
        let model = Model::load(&model_dir, Placement::cpu()).unwrap();
        // Different target sets per family; dropout is saved but inactive in eval.
        let targets = match i {
            0 => Target::ALL.to_vec(),
            1 => vec![Target::Q, Target::V],
            _ => vec![Target::K, Target::O, Target::Gate, Target::Down],
        };
        let config = LoraConfig {
            rank: 4 + 2 * i as i64,
            alpha: 16.0,
            dropout: 0.05,
            targets,
            use_rslora: false,
        };
        tch::manual_seed(11 + i as i64);
        let adapter = LoraAdapter::new(model.config(), config, tch::Device::Cpu).unwrap();
        // B starts at zero in training; make it non-zero so the delta shows.
        tch::no_grad(|| {
            for (_, mut var) in adapter.var_store().variables() {
                let noise = Tensor::randn(var.size(), (Kind::Float, tch::Device::Cpu)) * 0.1;
                var.copy_(&noise);
            }
        });
        let adapter_dir = work.join(format!("{family}-adapter"));
        adapter
            .save(&adapter_dir, Some(model_dir.to_str().unwrap()))
            .unwrap();

        let ids = reference(&model_dir.join("reference.safetensors"), "input_ids");
        let logits = tch::no_grad(|| model.forward(&ids, Some(&adapter), false).unwrap());
        let base = tch::no_grad(|| model.forward(&ids, None, false).unwrap());
        assert!(
            max_abs_diff(&logits, &base) > 1e-2,
            "{family}: the adapter changes nothing"
        );
        let out = work.join(format!("{family}-peft.safetensors"));
        jobs.push(serde_json::json!({
            "model": model_dir, "adapter": adapter_dir, "out": out,
        }));
        ours.push((family, logits, out));
    }
    let jobs_file = work.join("jobs.json");
    std::fs::write(&jobs_file, serde_json::to_string(&jobs).unwrap()).unwrap();
    run_fixtures(&["lora", jobs_file.to_str().unwrap()]);
    for (family, logits, out) in ours {
        let diff = max_abs_diff(&logits, &reference(&out, "logits"));
        println!("{family} + our adapter through PeftModel.from_pretrained: max diff {diff:.3e}");
        assert!(diff <= TOLERANCE, "{family}: max abs diff {diff}");
    }
}

#[test]
fn chat_templates_render_tool_conversations_like_apply_chat_template() {
    let dir = fixtures();
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("chat_cases.json")).unwrap())
            .unwrap();
    assert_eq!(cases.len(), 10);
    for case in &cases {
        let folder = dir.join(case["folder"].as_str().unwrap());
        let template = ChatTemplate::from_dir(&folder).unwrap();
        let tokenizer = Tokenizer::from_dir(&folder).unwrap();
        let messages = case["messages"].as_array().unwrap();
        let tools = case["tools"].as_array();
        let text = template
            .render(ChatInput {
                messages,
                tools: tools.map(Vec::as_slice),
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                extra: case["kwargs"].as_object(),
            })
            .unwrap();
        let label = format!("{} / {}", case["folder"], case["name"]);
        assert_eq!(text, case["text"].as_str().unwrap(), "{label}");
        let ids = tokenizer.encode(&text, false).unwrap();
        let want: Vec<i64> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(ids, want, "{label}");
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text, "{label}");
    }
}

#[test]
fn the_generate_command_answers_a_chat_message_with_a_model_folder() {
    let dir = fixtures();
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parity-chat-model");
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    for source in [dir.join("qwen2"), dir.join("tokenizer-qwen2.5")] {
        for entry in std::fs::read_dir(source).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, folder.join(path.file_name().unwrap())).unwrap();
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_clawback-trainer"))
        .args([
            "generate",
            "--device",
            "cpu",
            "--max-new-tokens",
            "12",
            "--prompt",
        ])
        .arg("What's the weather in Zürich?")
        .arg("--model")
        .arg(&folder)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A random model says something random, but it says it in tokens the tokenizer decodes.
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
}
