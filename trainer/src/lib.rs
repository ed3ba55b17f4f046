//! clawback's trainer: a Llama/Qwen-family decoder in tch, LoRA adapters in PEFT format,
//! the RL losses, the tokenizer + chat template that turn conversations into ids, and the
//! training loop over the datapool ([`train`]).

pub mod bench;
pub mod chat_template;
pub mod config;
pub mod generate;
pub mod json_file;
pub mod kv_cache;
pub mod lora;
pub mod losses;
pub mod model;
pub mod optim;
pub mod publish;
mod pyjson;
pub mod rope;
mod safetensors_io;
pub mod sampler;
pub mod samples;
pub mod schedule;
pub mod scoring;
pub mod serve;
#[cfg(test)]
mod test_support;
pub mod tiny_model;
pub mod tokenizer;
pub mod train;
pub mod weights;

pub use chat_template::{ChatInput, ChatTemplate};
pub use config::{Family, ModelConfig, RopeScaling};
pub use generate::{generate, Generation, SamplingParams};
pub use kv_cache::KvCache;
pub use lora::{AdapterRegistry, LoraAdapter, LoraConfig, Target};
pub use model::{Model, ModelError, Placement};
pub use tokenizer::Tokenizer;
