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
//! found", as from any server that forgot it. An entry counts against the budget with its whole
//! conversation (the entries it continues are held as long as it is), so what is held never
//! exceeds the budget; each tenant keeps at most its share of it, and past the whole budget the
//! tenant holding the most loses its oldest first, so tenants filling what they can — several
//! together — evict their own entries, never those of a tenant holding less; and a continuation whose whole conversation is over `max_body_bytes` is
//! refused, as the same body sent whole would be.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use clawback_datapool::{AssistantOutput, TenantId, TrajectoryId};
use serde_json::{json, Value};

use crate::data_plane::error::ProxyError;
use crate::data_plane::session::explicit::Continues;

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
    max_body_bytes: usize,
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
    // The body the engine would get: checked before it is built.
    if entry.conversation_bytes + json_bytes(&new_items) > max_body_bytes {
        return Err(ProxyError::ConversationTooLarge {
            limit: max_body_bytes,
        });
    }
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
    /// Serialised bytes of the whole conversation through this response (and its id).
    conversation_bytes: usize,
}

/// The serialised size of `items`.
fn json_bytes(items: &[Value]) -> usize {
    items
        .iter()
        .map(|item| serde_json::to_vec(item).map_or(0, |v| v.len()))
        .sum()
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

/// What one tenant keeps.
#[derive(Debug, Default)]
struct Kept {
    /// Its ids in the order they came, for eviction (an id evicted already is skipped).
    order: VecDeque<String>,
    /// Responses kept.
    count: usize,
    bytes: usize,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<(TenantId, String), Arc<Entry>>,
    tenants: HashMap<TenantId, Kept>,
    bytes: usize,
}

impl State {
    /// Evicts the oldest response of `tenant`; whether it had one.
    fn evict_oldest(&mut self, tenant: &TenantId) -> bool {
        let Some(oldest) = self
            .tenants
            .get_mut(tenant)
            .and_then(|k| k.order.pop_front())
        else {
            return false;
        };
        self.evict(&(tenant.clone(), oldest));
        true
    }

    /// The tenant holding the most bytes.
    fn largest(&self) -> Option<TenantId> {
        self.tenants
            .iter()
            .max_by_key(|(_, kept)| kept.bytes)
            .map(|(tenant, _)| tenant.clone())
    }

    /// Forgets the response `key`, if it is still kept.
    fn evict(&mut self, key: &(TenantId, String)) {
        let Some(gone) = self.entries.remove(key) else {
            return;
        };
        self.bytes -= gone.conversation_bytes;
        if let Some(kept) = self.tenants.get_mut(&key.0) {
            kept.bytes -= gone.conversation_bytes;
            kept.count -= 1;
            if kept.count == 0 {
                self.tenants.remove(&key.0);
            }
        }
    }
}

/// The responses relayed lately, per tenant.
#[derive(Debug)]
pub struct StoredResponses {
    state: Mutex<State>,
    budget: usize,
    per_tenant: usize,
}

impl StoredResponses {
    /// Keeps up to `budget` bytes of conversation (as serialised JSON), at most `per_tenant` of
    /// them for one tenant.
    pub fn new(budget: usize, per_tenant: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            budget,
            per_tenant: per_tenant.min(budget),
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
    /// to the conversation of `previous`. A conversation larger than the tenant's share is not
    /// kept (its continuation gets "not found").
    pub fn remember(
        &self,
        tenant: &TenantId,
        id: String,
        trajectory: TrajectoryId,
        previous: Option<Arc<Entry>>,
        items: Vec<Value>,
    ) {
        let conversation_bytes =
            previous.as_ref().map_or(0, |p| p.conversation_bytes) + json_bytes(&items) + id.len();
        if conversation_bytes > self.per_tenant {
            return;
        }
        let len = previous.as_ref().map_or(0, |p| p.len) + items.len();
        let entry = Arc::new(Entry {
            trajectory,
            previous,
            items,
            len,
            conversation_bytes,
        });
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.clone(), id);
        state.evict(&key);
        state.entries.insert(key.clone(), entry);
        state.bytes += conversation_bytes;
        let kept = state.tenants.entry(tenant.clone()).or_default();
        kept.bytes += conversation_bytes;
        kept.count += 1;
        kept.order.push_back(key.1);
        // The tenant's own oldest first, past its share; then the largest holder's, past the
        // whole.
        while state
            .tenants
            .get(tenant)
            .is_some_and(|k| k.bytes > self.per_tenant)
        {
            if !state.evict_oldest(tenant) {
                break;
            }
        }
        while state.bytes > self.budget {
            let Some(largest) = state.largest() else {
                break;
            };
            if !state.evict_oldest(&largest) {
                break;
            }
        }
        // A tenant's order forgets, now and then, the ids evicted by a rewrite: it stays O(kept).
        let State {
            entries, tenants, ..
        } = &mut *state;
        if let Some(kept) = tenants.get_mut(tenant) {
            if kept.order.len() > 2 * kept.count + 64 {
                kept.order
                    .retain(|id| entries.contains_key(&(tenant.clone(), id.clone())));
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
        let stored = StoredResponses::new(1 << 20, 1 << 20);
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
        let stored = StoredResponses::new(200, 200);
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
    fn a_chain_counts_whole_and_one_tenant_cannot_evict_anothers() {
        let stored = StoredResponses::new(1000, 500);
        let turn = |text: &str| vec![json!({"role": "user", "content": text})];
        stored.remember(
            &tenant("b"),
            "b_1".into(),
            TrajectoryId::new(),
            None,
            turn("bravo"),
        );
        // Alpha's long conversation: each entry counts its whole chain, so alpha holds at most
        // its share, and bravo's response stays.
        let t = TrajectoryId::new();
        let mut previous = None;
        for i in 0..50 {
            let id = format!("a_{i}");
            stored.remember(
                &tenant("a"),
                id.clone(),
                t,
                previous.clone(),
                turn(&"x".repeat(20)),
            );
            previous = stored.get(&tenant("a"), &id);
        }
        let state = stored.state.lock().unwrap();
        let alpha = state.tenants[&tenant("a")].bytes;
        assert!(alpha <= 500, "alpha holds {alpha}");
        assert!(state.bytes <= 1000);
        drop(state);
        assert!(stored.owns(&tenant("b"), "b_1"));
    }

    #[test]
    fn past_the_whole_budget_the_largest_holder_loses_first() {
        // Three tenants at their share each (a third of the whole) go over it together; the
        // honest tenant's small response, older than all of theirs, stays.
        let stored = StoredResponses::new(3000, 1000);
        let turn = |text: String| vec![json!({"role": "user", "content": text})];
        stored.remember(
            &tenant("honest"),
            "h_1".into(),
            TrajectoryId::new(),
            None,
            turn("hello".into()),
        );
        for round in 0..20 {
            for name in ["eve", "mallory", "default"] {
                stored.remember(
                    &tenant(name),
                    format!("{name}_{round}"),
                    TrajectoryId::new(),
                    None,
                    turn("x".repeat(100)),
                );
            }
        }
        assert!(stored.owns(&tenant("honest"), "h_1"));
        let state = stored.state.lock().unwrap();
        assert!(state.bytes <= 3000, "{} kept", state.bytes);
        for name in ["eve", "mallory", "default"] {
            assert!(state.tenants[&tenant(name)].bytes <= 1000);
        }
    }

    #[test]
    fn a_continuation_over_the_body_limit_is_refused_before_it_is_built() {
        let stored = StoredResponses::new(1 << 20, 1 << 20);
        stored.remember(
            &tenant("a"),
            "resp_1".into(),
            TrajectoryId::new(),
            None,
            vec![json!({"role": "user", "content": "x".repeat(5000)})],
        );
        let mut body = json!({"model": "m", "input": "more", "previous_response_id": "resp_1"});
        let refused = resolve(&stored, &tenant("a"), &mut body, 4096);
        assert!(matches!(
            refused,
            Err(ProxyError::ConversationTooLarge { limit: 4096 })
        ));
        assert!(resolve(&stored, &tenant("a"), &mut body, 1 << 20).is_ok());
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
