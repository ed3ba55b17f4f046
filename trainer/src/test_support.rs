//! Small random models shared by the unit tests.

use crate::config::ModelConfig;
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
