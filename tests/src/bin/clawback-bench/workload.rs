//! The request every proxy is measured with: what a coding or ops agent sends mid-task — a
//! system prompt, three tools, the user's ask, the model's tool call and the tool's result —
//! about 4 kB of JSON; the engine answers it with about 1 kB of text.

use bytes::Bytes;
use serde_json::{json, Value};

/// The size the request is padded to, in bytes of JSON.
pub const REQUEST_BYTES: usize = 4096;
/// The size of the engine's answer text (`mock-upstream --answer-bytes`).
pub const ANSWER_BYTES: usize = 1024;
/// The model name every proxy routes to the engine.
pub const MODEL: &str = "mock-llama";

fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}
        }
    })
}

fn tools() -> Value {
    json!([
        tool(
            "read_file",
            "Read a file of the repository and return its contents with line numbers.",
            json!({"path": {"type": "string", "description": "Path relative to the repository root."},
                   "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}),
            &["path"],
        ),
        tool(
            "run_command",
            "Run a shell command in the sandbox and return its exit status, stdout and stderr.",
            json!({"command": {"type": "string"},
                   "timeout_s": {"type": "integer", "description": "Seconds before it is killed."}}),
            &["command"],
        ),
        tool(
            "search_code",
            "Search the repository for a regular expression; returns matching lines with paths.",
            json!({"pattern": {"type": "string"}, "glob": {"type": "string"}}),
            &["pattern"],
        ),
    ])
}

/// The agent's request, `stream` or not, padded (in its system prompt) to about
/// [`REQUEST_BYTES`].
pub fn agent_request(stream: bool) -> Bytes {
    let build = |system: &str| {
        json!({
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "The CI job fails on the parser tests since this morning. Find out why and fix it."},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_7f3a", "type": "function",
                    "function": {"name": "run_command", "arguments": "{\"command\": \"cargo test -p parser 2>&1 | tail -20\"}"}
                }]},
                {"role": "tool", "tool_call_id": "call_7f3a",
                 "content": "test tokens::unicode_escapes ... FAILED\n\nthread 'tokens::unicode_escapes' panicked at src/tokens.rs:212:9:\nassertion `left == right` failed\n  left: Some('\\u{fffd}')\n right: Some('é')\n\ntest result: FAILED. 141 passed; 1 failed; 0 ignored"}
            ],
            "tools": tools(),
            "max_completion_tokens": 512,
            "temperature": 0.7,
            "stream": stream
        })
    };
    let mut system = String::from(
        "You are a careful software engineer working in the user's repository. Use the tools to \
         read code and run commands; never guess what a file contains. Explain what you found \
         before you change anything, keep changes small, and run the tests after each change.",
    );
    let (base, initial) = (build(&system).to_string().len(), system.len());
    while base + system.len() - initial < REQUEST_BYTES {
        system.push_str(" Prefer the project's own conventions over your habits.");
    }
    Bytes::from(build(&system).to_string())
}
