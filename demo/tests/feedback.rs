//! OpenClaw-RL's loop across real processes over loopback, the feedback scenario: simulated
//! users hold stitched multi-turn sessions through the sidecar, `user_feedback` and
//! `correction_hint` turn their next messages into rewards and hints, and the trainer learns
//! from the hints alone (OPD, `w_rl = 0`) and from both — each arm on its own stack from the
//! same taught base model. Checked from the summary it writes: with no hint in the context, each
//! tenant's preferred-style rate rose by the margins below, every request was served across the
//! swaps, and the datapool holds the hints the trainer distilled.

mod common;

use std::path::Path;

use common::demo;

/// The least gain in the preferred-style rate, per tenant and arm.
const MARGIN: f64 = 0.2;

#[test]
fn hints_alone_teach_each_tenant_its_taste_and_rewards_with_hints_do_too() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo-feedback");
    let mut command = demo(&dir);
    command
        .args(["--scenario", "feedback", "--arms", "opd,combined"])
        .args(["--progress-every", "5"]);
    let (summary, context) = common::run(command, &dir);
    let arms = summary["arms"].as_array().expect("arms");
    assert_eq!(arms.len(), 2, "{context}");
    for arm in arms {
        let name = arm["arm"].as_str().unwrap();
        assert_eq!(arm["requests"]["failed"], 0, "{name}\n{context}");
        assert_eq!(arm["publish_failures"], 0, "{name}\n{context}");
        for tenant in arm["tenants"].as_array().unwrap() {
            let who = format!("{name}/{}", tenant["name"]);
            // Before and after are 96 probes each: for a policy that did not change, their
            // difference has a standard deviation of about 0.07 (p ≈ 0.3), so a gain of 0.2 is
            // three of them. Seeded runs of this test (seeds 2-4, 7) gained 0.41-0.66 with
            // hints alone and 0.44-0.76 with both signals (docs/src/scenarios/tiny-model.md).
            let gain = tenant["gain"].as_f64().unwrap();
            assert!(gain >= MARGIN, "{who}: gain {gain} < {MARGIN}\n{context}");
            // The datapool holds the users' corrections as rewards and hints...
            let recorded = &tenant["recorded"];
            assert!(
                recorded["negative"].as_u64().unwrap() > 0,
                "{who}\n{context}"
            );
            assert!(recorded["hinted"].as_u64().unwrap() > 0, "{who}\n{context}");
            // ... and the trainer distilled hints in both arms, rewards only with w_rl > 0.
            assert!(tenant["hinted"].as_u64().unwrap() > 0, "{who}\n{context}");
            let rewarded = tenant["rewarded"].as_u64().unwrap();
            match name {
                "opd" => assert_eq!(rewarded, 0, "{who}\n{context}"),
                _ => assert!(rewarded > 0, "{who}\n{context}"),
            }
            assert_eq!(
                tenant["hints_not_distilled"]["opd_off"], 0,
                "{who}\n{context}"
            );
        }
    }
    common::assert_chart(&dir.join("preference-rate"));
}
