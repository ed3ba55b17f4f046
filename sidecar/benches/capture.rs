//! What the capture costs per answer: a vLLM chat answer of 256 tokens that the sidecar asked
//! ids and logprobs for (about 40 kB of JSON for 1 kB of text), read for the recorder and
//! stripped for the agent — whole (one body) and streamed (one chunk per token). Beside it, in
//! the same run, the same work with the answer read into a JSON tree first (how the capture
//! read it before it had typed readers): the ratio is what counts.

use std::hint::black_box;

use bytes::Bytes;
use clawback_sidecar::config::UpstreamKind;
use clawback_sidecar::data_plane::capture::strip::{strip, Stripped};
use clawback_sidecar::data_plane::capture::{Assembler, Capture, Endpoint, Injected, Unasked};
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};

const TOKENS: usize = 256;

fn logprob(i: usize) -> Value {
    let token = format!(" word{i}");
    json!({"token": token, "logprob": -0.123_456_789_f64 * (i % 7) as f64,
           "bytes": token.as_bytes(), "top_logprobs": []})
}

fn body() -> Vec<u8> {
    let text: String = (0..TOKENS).map(|i| format!(" word{i}")).collect();
    serde_json::to_vec(&json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": {"content": (0..TOKENS).map(logprob).collect::<Vec<_>>()},
                     "finish_reason": "stop", "token_ids": (0..TOKENS).collect::<Vec<_>>()}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": TOKENS, "total_tokens": 1000 + TOKENS},
        "prompt_token_ids": (0..1000).collect::<Vec<_>>(), "kv_transfer_params": null}))
    .unwrap_or_default()
}

fn stream() -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..TOKENS {
        let mut chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": format!(" word{i}")},
                         "logprobs": {"content": [logprob(i)]},
                         "finish_reason": if i + 1 == TOKENS { json!("stop") } else { json!(null) },
                         "token_ids": [i]}]});
        if i == 0 {
            chunk["prompt_token_ids"] = json!((0..1000).collect::<Vec<_>>());
        }
        out.extend_from_slice(format!("data: {chunk}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

/// The event as the agent gets it.
fn stripped(event: &[u8], injected: &Injected) -> Option<Vec<u8>> {
    match strip(event, injected) {
        Stripped::Rewritten(edits) => Some(edits.apply(event)),
        _ => None,
    }
}

fn capture(stream: bool) -> Capture {
    let mut request = json!({"model": "m", "messages": [], "stream": stream});
    Capture::for_request(UpstreamKind::Vllm, Endpoint::ChatCompletions, &mut request)
}

/// The capture as the relay drives it, the answer in 16 kB frames.
fn relay(capture: Capture, answer: &[u8], sse: bool) -> usize {
    let mut tap = capture.response(sse);
    let mut sent = 0;
    for frame in answer.chunks(16 << 10) {
        let frame = Bytes::copy_from_slice(frame);
        sent += tap.on_frame(&frame).bytes(frame).map_or(0, |b| b.len());
    }
    let finished = tap.finish();
    assert!(
        finished.assembled.engine.is_some(),
        "the ids were not captured"
    );
    sent + finished.tail.map_or(0, |t| t.len())
}

fn benches(c: &mut Criterion) {
    let (body, stream) = (body(), stream());
    eprintln!(
        "answer: {} B whole, {} B streamed",
        body.len(),
        stream.len()
    );
    let injected = Injected {
        token_ids: true,
        logprobs: true,
        unasked: Unasked::Null,
    };
    let mut group = c.benchmark_group("capture");
    group.bench_function("whole answer, typed reader", |b| {
        b.iter(|| relay(capture(false), black_box(&body), false))
    });
    group.bench_function("whole answer, JSON tree", |b| {
        b.iter(|| {
            let tree: Value = serde_json::from_slice(black_box(&body)).unwrap_or_default();
            let mut assembler = Assembler::new(Endpoint::ChatCompletions);
            assembler.on_body(&tree);
            black_box(stripped(&body, &injected));
            assembler.finish()
        })
    });
    group.bench_function("stream, typed reader", |b| {
        b.iter(|| relay(capture(true), black_box(&stream), true))
    });
    let events: Vec<&[u8]> = stream
        .split(|&b| b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data: "))
        .filter(|data| *data != b"[DONE]")
        .collect();
    group.bench_function("stream, JSON tree", |b| {
        b.iter(|| {
            let mut assembler = Assembler::new(Endpoint::ChatCompletions);
            for data in &events {
                let tree: Value = serde_json::from_slice(black_box(data)).unwrap_or_default();
                assembler.on_event(None, &tree);
                black_box(stripped(data, &injected));
            }
            assembler.on_done();
            assembler.finish()
        })
    });
    group.finish();
}

criterion_group!(name = capture_benches; config = Criterion::default().sample_size(30); targets = benches);
criterion_main!(capture_benches);
