//! Whole-system test support: the mock inference engine (vLLM's JSON and SSE shapes), an
//! in-process sidecar harness, and the load harness behind `clawback-bench`.

pub mod engine_json;
pub mod harness;
pub mod load;
pub mod mock;
pub mod redis_server;
