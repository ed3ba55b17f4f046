//! A realistic recorded trajectory: two turns of a tool-using agent served by vLLM with a LoRA
//! adapter, a tool result and a user reply as next states, a plugin reward, a hint and a thumbs-up.
//! It is the example of `SCHEMA.md` (a test keeps the two equal) and a fixture for the tests of
//! every crate that reads trajectories.

use std::collections::BTreeMap;

use serde_json::{json, Map};
use uuid::Uuid;

use crate::ids::{EvaluationId, StepId, TenantId, TrajectoryId, UnixMs};
use crate::logprobs::CompletionLogprobs;
use crate::schema::{
    AssistantOutput, Capture, CompletionReason, Endpoint, EngineTokens, Evaluation,
    EvaluationSource, NextState, PolicyRef, SamplingParams, Step, StepRequest, Timings,
    TokenLogprob, Tokens, TopLogprob, Trajectory, TrajectoryRecord, TrajectoryStatus, UpstreamKind,
    UpstreamRef, Usage, Verdict, SCHEMA_VERSION,
};

fn id(s: &str) -> Uuid {
    // The literals below are valid UUIDv7; a typo is a bug in this file, caught by its test.
    Uuid::parse_str(s).unwrap_or_else(|e| panic!("bad example uuid {s}: {e}"))
}

fn lp(token: &str, logprob: f64) -> TokenLogprob {
    TokenLogprob {
        token: token.into(),
        logprob,
        bytes: Some(token.as_bytes().to_vec()),
        top_logprobs: Vec::new(),
    }
}

/// The example trajectory of `tenant`, with fixed ids and times so the document stays stable.
pub fn tool_use_trajectory(tenant: TenantId) -> TrajectoryRecord {
    let traj = TrajectoryId::from_uuid(id("0193a8f2-7c41-7b2e-9d3a-5f1e2c4b6a01"));
    let step0 = StepId::from_uuid(id("0193a8f2-7c9e-7f10-8a55-0c2d4e6f8a12"));
    let step1 = StepId::from_uuid(id("0193a8f2-8a07-7c33-b1e2-3d4f5a6b7c23"));
    let t0 = 1_733_140_800_000u64;

    let system = json!({"role": "system", "content": "You are a helpful assistant. Use tools when they help."});
    let user = json!({"role": "user", "content": "What's the weather in Paris right now? Answer in Celsius."});
    let tool_call = json!({
        "id": "chatcmpl-tool-8f3b2a1c9d4e4f6a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}
    });
    let assistant0 =
        json!({"role": "assistant", "content": null, "tool_calls": [tool_call.clone()]});
    let tool_result = json!({
        "role": "tool",
        "tool_call_id": "chatcmpl-tool-8f3b2a1c9d4e4f6a",
        "content": "{\"city\":\"Paris\",\"temperature\":11.5,\"unit\":\"celsius\",\"conditions\":\"light rain\"}"
    });
    let tools = vec![json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city"]
            }
        }
    })];
    let sampling = SamplingParams {
        temperature: Some(0.7),
        top_p: Some(0.95),
        max_tokens: Some(512),
        ..SamplingParams::default()
    };
    let upstream = UpstreamRef {
        name: "vllm-a".into(),
        kind: UpstreamKind::Vllm,
        model: "acme@v17".into(),
    };
    let policy = Some(PolicyRef {
        adapter: "acme@v17".into(),
        version: 17,
    });

    let first = Step {
        schema_version: SCHEMA_VERSION,
        id: step0,
        tenant: tenant.clone(),
        trajectory: traj,
        index: 0,
        trainable: true,
        endpoint: Endpoint::ChatCompletions,
        request: StepRequest {
            messages: vec![system.clone(), user.clone()],
            tools: tools.clone(),
            tool_choice: Some(json!("auto")),
            sampling: sampling.clone(),
        },
        output: AssistantOutput {
            content: None,
            reasoning_content: Some(
                "The user wants the current weather in Paris; call get_weather.".into(),
            ),
            tool_calls: vec![tool_call],
        },
        // Prompt ids shortened for the document: a real chat template yields a few hundred.
        tokens: Tokens::Engine(EngineTokens {
            prompt_token_ids: vec![
                151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198,
                3838, 594, 279, 9104, 304, 12095, 1290, 1431, 30, 151645, 198, 151644, 77091, 198,
            ],
            completion_token_ids: vec![
                151657, 198, 4913, 606, 788, 330, 455, 69364, 151658, 151645,
            ],
            completion_logprobs: CompletionLogprobs::from(vec![
                TokenLogprob {
                    top_logprobs: vec![
                        TopLogprob {
                            token: "<tool_call>".into(),
                            logprob: -0.0123,
                            bytes: Some(b"<tool_call>".to_vec()),
                        },
                        TopLogprob {
                            token: "The".into(),
                            logprob: -4.4187,
                            bytes: Some(b"The".to_vec()),
                        },
                    ],
                    ..lp("<tool_call>", -0.0123)
                },
                lp("\n", -0.0002),
                lp("{\"", -0.0011),
                lp("name", -0.0001),
                lp("\":", -0.00003),
                lp(" \"", -0.0004),
                lp("get", -0.0021),
                lp("_weather", -0.0003),
                lp("</tool_call>", -0.0009),
                lp("<|im_end|>", -0.0001),
            ]),
        }),
        policy: policy.clone(),
        upstream: upstream.clone(),
        finish_reason: Some("tool_calls".into()),
        usage: Some(Usage {
            prompt_tokens: 28,
            completion_tokens: 10,
            total_tokens: 38,
        }),
        timings: Timings {
            started_at: UnixMs(t0 + 20),
            first_token_at: Some(UnixMs(t0 + 182)),
            finished_at: UnixMs(t0 + 431),
        },
        next_state: Some(NextState {
            messages: vec![tool_result.clone()],
            observed_at: UnixMs(t0 + 1_204),
        }),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        truncated: false,
        capture: Some(Capture::Tokens),
    };

    let answer = "It's 11.5 °C in Paris right now, with light rain.";
    let second = Step {
        schema_version: SCHEMA_VERSION,
        id: step1,
        tenant: tenant.clone(),
        trajectory: traj,
        index: 1,
        trainable: true,
        endpoint: Endpoint::ChatCompletions,
        request: StepRequest {
            messages: vec![system, user, assistant0, tool_result],
            tools,
            tool_choice: Some(json!("auto")),
            sampling,
        },
        output: AssistantOutput {
            content: Some(answer.into()),
            reasoning_content: None,
            tool_calls: Vec::new(),
        },
        tokens: Tokens::Engine(EngineTokens {
            prompt_token_ids: vec![
                151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198,
                3838, 594, 279, 9104, 304, 12095, 1290, 1431, 30, 151645, 198, 151644, 77091, 198,
                151657, 198, 4913, 606, 788, 330, 455, 69364, 151658, 151645, 198, 151644, 872,
                198, 151665, 198, 4913, 8926, 3252, 12095, 151666, 151645, 198, 151644, 77091, 198,
            ],
            completion_token_ids: vec![
                2132, 594, 220, 16, 16, 13, 20, 36286, 34, 304, 12095, 1290, 1431, 11, 448, 3100,
                11174, 13, 151645,
            ],
            completion_logprobs: [
                ("It", -0.2107),
                ("'s", -0.0312),
                (" ", -0.0458),
                ("1", -0.0001),
                ("1", -0.0002),
                (".", -0.0003),
                ("5", -0.0001),
                (" °", -0.3791),
                ("C", -0.0004),
                (" in", -0.0632),
                (" Paris", -0.0008),
                (" right", -0.1224),
                (" now", -0.0019),
                (",", -0.0931),
                (" with", -0.0275),
                (" light", -0.0114),
                (" rain", -0.0009),
                (".", -0.0057),
                ("<|im_end|>", -0.0002),
            ]
            .into_iter()
            .map(|(t, l)| lp(t, l))
            .collect(),
        }),
        policy,
        upstream,
        finish_reason: Some("stop".into()),
        usage: Some(Usage {
            prompt_tokens: 54,
            completion_tokens: 19,
            total_tokens: 73,
        }),
        timings: Timings {
            started_at: UnixMs(t0 + 1_204),
            first_token_at: Some(UnixMs(t0 + 1_297)),
            finished_at: UnixMs(t0 + 1_618),
        },
        next_state: Some(NextState {
            messages: vec![json!({"role": "user", "content": "Thanks! Do I need an umbrella?"})],
            observed_at: UnixMs(t0 + 9_840),
        }),
        traceparent: None,
        truncated: false,
        capture: Some(Capture::Tokens),
    };

    let plugin = EvaluationSource::Plugin {
        name: "tool-success".into(),
        content_hash: "sha256:9f2c4e1ab0d37c55e8a1f6b2d49c7e03a5b8f1d2c6e4a9b0d3f7c1e5a2b4d6f8"
            .into(),
    };
    let mut labels = BTreeMap::new();
    labels.insert("judge_votes".into(), "+1,+1,+1".into());
    let evaluations = vec![
        Evaluation {
            schema_version: SCHEMA_VERSION,
            id: EvaluationId::from_uuid(id("0193a8f2-8b10-7d44-a2f3-4e5f6a7b8c34")),
            tenant: tenant.clone(),
            trajectory: traj,
            step: Some(step0),
            source: plugin.clone(),
            verdict: Verdict::Score {
                reward: Some(1.0),
                hint: None,
            },
            labels,
            created_at: UnixMs(t0 + 1_290),
        },
        Evaluation {
            schema_version: SCHEMA_VERSION,
            id: EvaluationId::from_uuid(id("0193a8f2-a3c2-7e55-93a4-5f6a7b8c9d45")),
            tenant: tenant.clone(),
            trajectory: traj,
            step: Some(step1),
            source: EvaluationSource::Plugin {
                name: "opd-hint".into(),
                content_hash:
                    "sha256:1d7e3b9a4c2f8e6d0b5a7c9e1f3d5b7a9c2e4f6d8b0a1c3e5f7d9b2a4c6e8f0a".into(),
            },
            verdict: Verdict::Score {
                reward: None,
                hint: Some(
                    "Answer whether an umbrella is needed too: light rain means yes.".into(),
                ),
            },
            labels: BTreeMap::new(),
            created_at: UnixMs(t0 + 9_910),
        },
        Evaluation {
            schema_version: SCHEMA_VERSION,
            id: EvaluationId::from_uuid(id("0193a8f2-c1d0-7f66-84b5-6a7b8c9d0e56")),
            tenant: tenant.clone(),
            trajectory: traj,
            step: None,
            source: EvaluationSource::Feedback {
                channel: "handshake".into(),
            },
            verdict: Verdict::Score {
                reward: Some(1.0),
                hint: None,
            },
            labels: BTreeMap::new(),
            created_at: UnixMs(t0 + 15_020),
        },
    ];

    let mut metadata = Map::new();
    metadata.insert("agent".into(), json!("openclaw"));
    metadata.insert("task".into(), json!("weather-lookup"));
    TrajectoryRecord {
        trajectory: Trajectory {
            schema_version: SCHEMA_VERSION,
            id: traj,
            tenant,
            group: None,
            metadata,
            status: TrajectoryStatus::Completed,
            created_at: UnixMs(t0),
            completed_at: Some(UnixMs(t0 + 15_000)),
            completion: Some(CompletionReason::Handshake),
        },
        steps: vec![first, second],
        evaluations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_round_trips_through_json() {
        let tenant = TenantId::new("acme").unwrap_or_else(|e| panic!("{e}"));
        let record = tool_use_trajectory(tenant);
        for step in &record.steps {
            let Tokens::Engine(t) = &step.tokens else {
                panic!("example steps carry engine tokens")
            };
            assert_eq!(t.completion_token_ids.len(), t.completion_logprobs.len());
        }
        let json = serde_json::to_string(&record).unwrap_or_else(|e| panic!("{e}"));
        let back: TrajectoryRecord = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, record);
    }
}
