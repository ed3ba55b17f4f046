//! The model clawback trains and serves, in tch: a Llama/Qwen2/Qwen3-family decoder loaded from
//! an HF folder ([`model`], [`weights`], [`config`], [`rope`], [`kv_cache`]), LoRA adapters in
//! PEFT format ([`lora`]), the tokenizer and chat template that turn conversations into ids
//! ([`tokenizer`], [`chat_template`]), greedy and sampled generation ([`generate`]), and tiny
//! random models written as real HF folders for tests and demos ([`tiny_model`]). The trainer
//! (`clawback-trainer`) and the reference engine (`clawback-serve`) both build on it.

pub mod chat_template;
pub mod config;
pub mod generate;
pub mod json_file;
pub mod kv_cache;
pub mod lora;
pub mod model;
pub mod pyjson;
pub mod rope;
pub mod safetensors_io;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod tiny_model;
pub mod tokenizer;
pub mod weights;

pub use chat_template::{ChatInput, ChatTemplate};
pub use config::{Family, ModelConfig, RopeScaling};
pub use generate::{generate, Generation, SamplingParams};
pub use kv_cache::KvCache;
pub use lora::{AdapterRegistry, LoraAdapter, LoraConfig, Target};
pub use model::{Model, ModelError, Placement};
pub use tokenizer::Tokenizer;
