//! Bodies the sidecar cannot read are refused, never passed through: a tenant's agent sends
//! model calls in JSON that Python's `json` (the engine's parser) reads and serde_json does not —
//! `NaN`, `Infinity`, huge exponents, a byte-order mark, comments, lone surrogates, a key twice —
//! each naming another tenant's adapter, and none of them reaches the engine, whatever the
//! sidecar's routing and recording. (The same attack against the real vLLM, which would serve
//! it: trainer/tests/smollm2/tenancy.rs.)

use clawback_tests::harness::Sidecar;
use clawback_tests::mock::MockUpstream;
use proptest::prelude::*;
use proptest::test_runner::{Config as Cases, TestCaseError, TestRunner};
use serde_json::Value;

use crate::anthropic::assert_anthropic_error;
use crate::support::{assert_openai_error, client};
use crate::tenancy::{two_tenants, ALPHA_KEY};

/// Every POST route of the default agent API.
const ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/s/sess-1/v1/chat/completions",
];

/// A JSON value Python's `json.loads` takes and serde_json refuses, or a standard one.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("NaN".to_owned()),
        Just("Infinity".to_owned()),
        Just("-Infinity".to_owned()),
        (309..2000u32).prop_map(|e| format!("1e{e}")),
        (309..2000u32).prop_map(|e| format!("-2.5E+{e}")),
        Just(r#""\ud800""#.to_owned()),
        Just(r#""\udfff tail""#.to_owned()),
        Just("1".to_owned()),
        Just(r#""plain""#.to_owned()),
        Just("[1, 2.5, null]".to_owned()),
    ]
}

/// How a hostile agent spells the other tenant's adapter.
fn model() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(r#""model": "bravo@v1""#.to_owned()),
        Just(r#""model": "bravo\u0040v1""#.to_owned()),
        Just(r#""model": "alpha@v1", "model": "bravo@v1""#.to_owned()),
        Just(r#""model": "bravo@v1", "model": "alpha@v1""#.to_owned()),
        Just(r#""mod\u0065l": "bravo@v1", "model": "alpha@v1""#.to_owned()),
    ]
}

/// A model-call body that names tenant bravo's adapter, in JSON that is standard or not.
fn hostile_body() -> impl Strategy<Value = Vec<u8>> {
    (
        model(),
        proptest::collection::vec(value(), 0..3),
        any::<bool>(),
        prop_oneof![
            Just(""),
            Just("\u{feff}"),
            Just("/* engine */ "),
            Just("// engine\n")
        ],
        prop_oneof![Just(""), Just(","), Just(" /* tail */")],
        any::<prop::sample::Index>(),
    )
        .prop_map(|(model, values, nested, prefix, suffix, at)| {
            let mut fields = vec![
                model,
                r#""messages": [{"role": "user", "content": "hi"}]"#.to_owned(),
                r#""input": "hi", "prompt": "hi", "max_tokens": 8"#.to_owned(),
            ];
            for (n, value) in values.into_iter().enumerate() {
                fields.push(match nested {
                    true => format!(r#""extra_body": {{"x{n}": {{"y": {value}}}}}"#),
                    false => format!(r#""temperature{n}": {value}"#),
                });
            }
            let last = fields.len();
            fields.swap(0, at.index(last));
            format!("{prefix}{{{}{suffix}}}", fields.join(", ")).into_bytes()
        })
}

/// Sends `body` as tenant alpha to every route; each must be refused in its API's shape.
async fn refused_everywhere(sidecar: &Sidecar, body: &[u8]) -> Result<(), TestCaseError> {
    for route in ROUTES {
        let response = client()
            .post(sidecar.url(route))
            .bearer_auth(ALPHA_KEY)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| TestCaseError::fail(format!("{route}: {e}")))?;
        let status = response.status().as_u16();
        let answer: Value = response
            .json()
            .await
            .map_err(|e| TestCaseError::fail(format!("{route}: {e}")))?;
        prop_assert!(
            status == 400 || status == 404,
            "{route} answered {status}: {answer}"
        );
        match route.contains("/messages") {
            true => assert_anthropic_error(
                &answer,
                if status == 400 {
                    "invalid_request_error"
                } else {
                    "not_found_error"
                },
            ),
            // A body read whole may be refused for a field the engine would read beside the
            // model (`input` on a chat call): refused all the same.
            false if answer["error"]["code"] == "not_forwarded" => {
                assert_openai_error(&answer, "not_forwarded")
            }
            false => assert_openai_error(
                &answer,
                if status == 400 {
                    "invalid_body"
                } else {
                    "model_not_found"
                },
            ),
        }
    }
    Ok(())
}

#[test]
fn no_body_that_names_another_tenants_adapter_reaches_the_engine_however_it_is_spelled() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let engine = runtime.block_on(MockUpstream::start());
    let sidecars = runtime.block_on(async {
        let routed = two_tenants(&engine);
        let mut recorded = two_tenants(&engine);
        recorded.routing.base_model = None;
        let mut neither = two_tenants(&engine);
        neither.routing.base_model = None;
        neither.recording.enabled = false;
        let mut sidecars = Vec::new();
        for config in [routed, recorded, neither] {
            sidecars.push(Sidecar::start(config).await);
        }
        sidecars
    });
    let mut runner = TestRunner::new(Cases {
        cases: 48,
        ..Cases::default()
    });
    let outcome = runner.run(&hostile_body(), |body| {
        for sidecar in &sidecars {
            runtime.block_on(refused_everywhere(sidecar, &body))?;
        }
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    assert_eq!(engine.request_count(), 0, "{:?}", engine.received());
}
