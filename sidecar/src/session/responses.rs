//! Stateful Responses: what each response the sidecar relayed was made of, by its id and tenant,
//! so that a call that sends only its new items with `previous_response_id` is served and
//! recorded with the whole conversation.
//!
//! The sidecar resolves `previous_response_id` itself instead of leaving it to the engine: the
//! engine gets the whole conversation as `input` (vLLM keeps no responses unless
//! `VLLM_ENABLE_RESPONSES_API_STORE` is set, SGLang none, and a pool of engines shares none),
//! the step records exactly what the engine rendered, and an id is only ever resolved for the
//! tenant whose call produced it — one tenant cannot continue, or read, another's conversation
//! through an engine's store.
//!
//! Each entry holds what its call added (its new input items and its reply) and points at the
//! entry it continued, so a session of n turns costs O(n) memory, not O(n²). Entries are kept up
//! to a byte budget, oldest first out; a session whose entry was evicted gets the engine's "not
//! found", as from any server that forgot it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use clawback_datapool::{AssistantOutput, TenantId, TrajectoryId};
use serde_json::{json, Value};

use crate::error::ProxyError;
use crate::session::explicit::Continues;

/// What a Responses call adds to its conversation: the response it continued, and its new input
/// items as the agent sent them (its reply is added when it has one).
#[derive(Debug, Clone)]
pub struct Turn {
    pub previous: Option<Arc<Entry>>,
    pub new_items: Vec<Value>,
}

/// A Responses request's `input` as items (a string is one user message).
fn input_items(input: &Value) -> Vec<Value> {
    match input {
        Value::String(text) => vec![json!({"role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// Resolves a Responses request's `previous_response_id` for `tenant`: the request's `input`
/// becomes the whole conversation and the id is taken out, so the engine needs no state of its
/// own. An id that is not one of `tenant`'s responses is refused as not found.
pub fn resolve(
    stored: &StoredResponses,
    tenant: &TenantId,
    body: &mut Value,
) -> Result<(Turn, Option<Continues>), ProxyError> {
    let new_items = input_items(&body["input"]);
    let Some(id) = body["previous_response_id"].as_str().map(str::to_owned) else {
        return Ok((
            Turn {
                previous: None,
                new_items,
            },
            None,
        ));
    };
    let entry = stored
        .get(tenant, &id)
        .ok_or(ProxyError::ResponseNotFound { id })?;
    let mut input = entry.conversation();
    input.extend(new_items.iter().cloned());
    if let Some(request) = body.as_object_mut() {
        request.shift_remove("previous_response_id");
        request.insert("input".to_owned(), Value::Array(input));
    }
    let continues = Continues {
        trajectory: entry.trajectory,
        next_state: new_items.clone(),
    };
    Ok((
        Turn {
            previous: Some(entry),
            new_items,
        },
        Some(continues),
    ))
}

/// One relayed response.
#[derive(Debug)]
pub struct Entry {
    /// The trajectory the response's call was recorded in.
    pub trajectory: TrajectoryId,
    previous: Option<Arc<Entry>>,
    /// What this call added to the conversation, its reply last.
    items: Vec<Value>,
    /// Items in the whole conversation through this response.
    len: usize,
    bytes: usize,
}

impl Entry {
    /// The conversation through this response, as Responses `input` items, without the
    /// instructions of any call (per the Responses API they do not carry over).
    pub fn conversation(&self) -> Vec<Value> {
        let mut chain = Vec::new();
        let mut at = Some(self);
        while let Some(entry) = at {
            chain.push(entry);
            at = entry.previous.as_deref();
        }
        let mut out = Vec::with_capacity(self.len);
        for entry in chain.into_iter().rev() {
            out.extend(entry.items.iter().cloned());
        }
        out
    }

    /// How many items [`conversation`](Self::conversation) has.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The reply of a response as the input items that stand for it in the next call: an assistant
/// message for its text, a `function_call` item per tool call.
pub fn reply_items(output: &AssistantOutput) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(text) = output.content.as_deref().filter(|t| !t.is_empty()) {
        items.push(json!({"role": "assistant", "content": text}));
    }
    for call in &output.tool_calls {
        let function = &call["function"];
        items.push(json!({
            "type": "function_call",
            "call_id": call["id"],
            "name": function["name"],
            "arguments": function["arguments"],
        }));
    }
    items
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<(TenantId, String), Arc<Entry>>,
    /// Keys in the order they came, for eviction.
    order: VecDeque<(TenantId, String)>,
    bytes: usize,
}

/// The responses relayed lately, per tenant.
#[derive(Debug)]
pub struct StoredResponses {
    state: Mutex<State>,
    budget: usize,
}

impl StoredResponses {
    /// Keeps up to `budget` bytes of conversation (as serialised JSON).
    pub fn new(budget: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            budget,
        }
    }

    /// The response `id` of `tenant`; `None` for an unknown id or another tenant's.
    pub fn get(&self, tenant: &TenantId, id: &str) -> Option<Arc<Entry>> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.entries.get(&(tenant.clone(), id.to_owned())).cloned()
    }

    /// Whether `tenant` made response `id` (for `GET /v1/responses/{id}`).
    pub fn owns(&self, tenant: &TenantId, id: &str) -> bool {
        self.get(tenant, id).is_some()
    }

    /// Keeps response `id`: the call that made it added `items` (its new input, then its reply)
    /// to the conversation of `previous`.
    pub fn remember(
        &self,
        tenant: &TenantId,
        id: String,
        trajectory: TrajectoryId,
        previous: Option<Arc<Entry>>,
        items: Vec<Value>,
    ) {
        let bytes = items
            .iter()
            .map(|item| serde_json::to_vec(item).map_or(0, |v| v.len()))
            .sum::<usize>()
            + id.len();
        let len = previous.as_ref().map_or(0, |p| p.len) + items.len();
        let entry = Arc::new(Entry {
            trajectory,
            previous,
            items,
            len,
            bytes,
        });
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.clone(), id);
        if let Some(old) = state.entries.insert(key.clone(), entry) {
            state.bytes -= old.bytes;
        } else {
            state.order.push_back(key);
        }
        state.bytes += bytes;
        while state.bytes > self.budget {
            let Some(oldest) = state.order.pop_front() else {
                break;
            };
            if let Some(gone) = state.entries.remove(&oldest) {
                state.bytes -= gone.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    #[test]
    fn a_chain_of_responses_gives_the_whole_conversation_to_its_tenant_only() {
        let stored = StoredResponses::new(1 << 20);
        let t = TrajectoryId::new();
        stored.remember(
            &tenant("a"),
            "resp_1".into(),
            t,
            None,
            vec![
                json!({"role": "user", "content": "hi"}),
                json!({"role": "assistant", "content": "hello"}),
            ],
        );
        let first = stored.get(&tenant("a"), "resp_1").unwrap();
        stored.remember(
            &tenant("a"),
            "resp_2".into(),
            t,
            Some(first),
            vec![
                json!({"role": "user", "content": "more"}),
                json!({"role": "assistant", "content": "sure"}),
            ],
        );
        let second = stored.get(&tenant("a"), "resp_2").unwrap();
        let texts: Vec<String> = second
            .conversation()
            .iter()
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(texts, ["hi", "hello", "more", "sure"]);
        assert_eq!(second.len(), 4);
        assert!(stored.get(&tenant("b"), "resp_2").is_none());
        assert!(!stored.owns(&tenant("b"), "resp_1"));
    }

    #[test]
    fn the_oldest_responses_go_first_past_the_budget() {
        let stored = StoredResponses::new(200);
        for i in 0..10 {
            stored.remember(
                &tenant("a"),
                format!("resp_{i}"),
                TrajectoryId::new(),
                None,
                vec![json!({"role": "user", "content": "x".repeat(40)})],
            );
        }
        assert!(stored.get(&tenant("a"), "resp_0").is_none());
        assert!(stored.get(&tenant("a"), "resp_9").is_some());
    }

    #[test]
    fn a_reply_becomes_an_assistant_message_and_function_call_items() {
        let output = AssistantOutput {
            content: Some("Looking.".into()),
            tool_calls: vec![json!({"id": "call_1", "type": "function",
                                    "function": {"name": "ls", "arguments": "{}"}})],
            ..AssistantOutput::default()
        };
        assert_eq!(
            reply_items(&output),
            vec![
                json!({"role": "assistant", "content": "Looking."}),
                json!({"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"}),
            ]
        );
    }
}
