//! Small random models and adapters for tests: this crate's, and other crates' with the
//! `test-support` feature.

use crate::config::ModelConfig;
use crate::lora::{LoraAdapter, LoraConfig};
use crate::model::{Model, Placement};

/// A two-layer Qwen2-shaped config with grouped heads and tied embeddings.
pub fn tiny_config() -> ModelConfig {
    ModelConfig::from_json(
        r#"{"model_type": "qwen2", "vocab_size": 50, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "tie_word_embeddings": true}"#,
    )
    .expect("the tiny config parses")
}

/// A random model of [`tiny_config`], the same for the same seed.
pub fn tiny_model(seed: i64) -> Model {
    // A second thread only adds OpenMP spinning at this size.
    tch::set_num_threads(1);
    tch::manual_seed(seed);
    Model::random(tiny_config(), Placement::cpu()).expect("random weights fit their config")
}

/// An adapter for `config` whose every factor is drawn from N(0, `scale`²) with `seed` (a
/// fresh adapter's B is zero and changes nothing): one that visibly moves the model's outputs.
pub fn random_adapter(
    config: &ModelConfig,
    lora: LoraConfig,
    seed: i64,
    scale: f64,
) -> LoraAdapter {
    tch::manual_seed(seed);
    let adapter = LoraAdapter::new(config, lora, tch::Device::Cpu)
        .expect("a LoRA config that fits the model");
    tch::no_grad(|| {
        for (_, mut var) in adapter.var_store().variables() {
            let noise = tch::Tensor::randn_like(&var) * scale;
            var.copy_(&noise);
        }
    });
    adapter
}
