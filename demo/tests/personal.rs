//! OpenClaw-RL's loop on a real model, bounded for the test command: SmolLM2-135M-Instruct
//! (converted by `scripts/test`) served by the real vLLM, the personal scenario's two tenants,
//! hint distillation alone (the arm that moved both tenants in every seeded run), four rounds
//! at a learning rate of 1e-3 (at the scenario's 5e-4, three rounds moved one seed by only 0.12).
//! Checked from the summary it writes: with no hint in the context, the tenants' preferred-form
//! rates rose by the margin below on average, and neither fell; every request was served across the swaps;
//! the datapool holds the users' corrections as rewards and hints, and the trainer distilled
//! them for both tenants; each tenant's answers to the held-out factual questions were measured
//! before and after (the gate itself is off here: every version goes live, as the margin below
//! was measured; the gate's own test is the trainer's `smollm2::gate`).

mod common;

use std::path::Path;

use common::demo;

/// The least gain in the two tenants' preferred-form rates, on average. Before and after are
/// 32 held-out probes each; for a policy that did not change, at a base rate of 0.16 for both
/// tenants (the highest measured: bullets 0.17, brief 0.04), the after counts beat the before
/// counts by 16 of 64 (0.25, 3.9 standard deviations) less than one time in 10,000. Three-round runs (README) gained 0.57 and
/// 0.59 (seeded release runs), 0.40 and 0.38 (CI runs; in one brief moved by 0.08 only, when
/// brief alone was asked for 0.25) — and 0.21 in a fresh-machine CI run (2026-12-07, 24 probes
/// each, both tenants 5 of 24 up): learning from sampled users is a draw, so the test gives it a
/// fourth round, and its probes a third more to measure it with.
const MARGIN: f64 = 0.25;

#[test]
fn hints_teach_a_real_model_each_tenants_form_without_the_hint() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo-personal");
    let mut command = demo(&dir);
    command
        .args(["--scenario", "personal", "--arms", "opd"])
        .args(["--rounds", "4", "--lr", "1e-3", "--gate", "off"])
        .args(["--final-probes", "32", "--probe-every", "100"])
        .args(["--progress-every", "30"]);
    let (summary, context) = common::run(command, &dir);
    let arm = &summary["arms"][0];
    assert_eq!(arm["arm"], "opd", "{context}");
    assert_eq!(arm["requests"]["failed"], 0, "{context}");
    assert_eq!(arm["publish_failures"], 0, "{context}");
    assert!(arm["swaps"].as_u64().unwrap() >= 2, "{context}");
    for tenant in arm["tenants"].as_array().unwrap() {
        let who = tenant["name"].as_str().unwrap();
        let recorded = &tenant["recorded"];
        assert!(
            recorded["negative"].as_u64().unwrap() > 0,
            "{who}\n{context}"
        );
        assert!(recorded["hinted"].as_u64().unwrap() > 0, "{who}\n{context}");
        assert!(tenant["hinted"].as_u64().unwrap() > 0, "{who}\n{context}");
        assert_eq!(
            tenant["rewarded"], 0,
            "{who}: rewards in the OPD arm\n{context}"
        );
        // The teacher — the base model with the hint — does what the tenant wants more often
        // than the base model without it: what there is to distil. (Measured 0.83–0.90 against
        // 0.00–0.04 for brief, 0.42–0.65 against 0.00–0.15 for bullets: a wider bound would
        // make bullets' 24 probes a coin toss.)
        let (teacher, before) = (
            tenant["teacher"]["fitted"].as_f64().unwrap()
                / tenant["teacher"]["probes"].as_f64().unwrap(),
            tenant["before"]["fitted"].as_f64().unwrap()
                / tenant["before"]["probes"].as_f64().unwrap(),
        );
        assert!(
            teacher > before,
            "{who}: teacher {teacher}, base {before}\n{context}"
        );
        // What the users could lose, measured on both sides of the arm: every factual question
        // asked and checked, and the base answers some of them.
        let (kept_before, kept_after) = (&tenant["kept"][0], &tenant["kept"][1]);
        assert_eq!(kept_before["asked"], 40, "{who}\n{context}");
        assert_eq!(kept_after["asked"], 40, "{who}\n{context}");
        assert!(
            kept_before["answered"].as_u64().unwrap() > 0,
            "{who}\n{context}"
        );
    }
    assert_eq!(arm["tenants"][0]["name"], "brief");
    let gains: Vec<f64> = arm["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["gain"].as_f64().unwrap())
        .collect();
    let mean = gains.iter().sum::<f64>() / gains.len() as f64;
    assert!(
        mean >= MARGIN && gains.iter().all(|g| *g >= 0.0),
        "gains {gains:?}: their mean is under {MARGIN}, or one fell\n{context}"
    );
    common::assert_chart(&dir.join("preference-rate"));
}
