//! Whole-system test support: the mock inference engine (vLLM's JSON and SSE shapes), an
//! in-process sidecar harness, real front doors (nginx, Envoy) as child processes, and the load
//! harness behind `clawback-bench`.

pub mod book_commands;
pub mod deploy_tools;
pub mod engine_json;
pub mod front_door;
pub mod harness;
pub mod load;
pub mod mock;
pub mod process;
pub mod redis_server;
pub mod shape;
pub mod vllm;
