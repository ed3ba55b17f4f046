//! Two tenants on one sidecar, one of them abusive: the other's latency and success rate while
//! the abuser sends four times its share of calls at once, against the same load alone — with
//! fair shares (`limits.tenant_share`, ½) and without them (1), in one run.
//!
//! The engine takes 100 ms per call (a busy engine: calls hold their place while they are
//! served); the sidecar serves 64 calls at once and records into its embedded store.

use std::path::Path;
use std::time::Duration;

use clawback_tests::load::{closed_loop, open_loop, HttpClient, PhaseResult, Target, Turn};

use crate::{ms, procs, warm_up, workload, Run};

const ALPHA_KEY: &str = "sk-bench-alpha";
const BRAVO_KEY: &str = "sk-bench-bravo";
const CAPACITY: usize = 64;
/// The abuser's calls at once: four times its share.
const ABUSE: usize = CAPACITY * 2;
/// The engine's time per call.
const ENGINE_MS: u64 = 100;

fn target(url: &str, bearer: &'static str) -> Target {
    Target {
        url: format!("{url}/v1/chat/completions"),
        turns: vec![Turn {
            body: workload::agent_request(false),
            headers: vec![("x-clawback-done", "true"), ("authorization", bearer)],
        }],
        session_header: Some("x-clawback-session"),
        first_byte: false,
    }
}

/// One configuration's phases: bravo alone, then bravo beside alpha's abuse.
struct Phases {
    alone: PhaseResult,
    beside: PhaseResult,
    abuser: PhaseResult,
}

fn success(phase: &PhaseResult) -> f64 {
    100.0 * (phase.sent - phase.errors) as f64 / phase.sent.max(1) as f64
}

async fn phases(client: &HttpClient, url: &str, rate: u32, seconds: u64) -> Phases {
    let phase = Duration::from_secs(seconds);
    let bravo = target(url, "Bearer sk-bench-bravo");
    let alpha = target(url, "Bearer sk-bench-alpha");
    warm_up(client, &bravo).await;
    let alone = open_loop(client, &bravo, rate, phase).await;
    let (beside, abuser) = tokio::join!(
        open_loop(client, &bravo, rate, phase),
        closed_loop(client, &alpha, ABUSE, phase),
    );
    Phases {
        alone,
        beside,
        abuser,
    }
}

/// The section of the report: bravo's figures alone and beside the abuser, with and without
/// fair shares.
pub async fn two_tenants(
    client: &HttpClient,
    run: &Run<'_>,
    engine: &Path,
    rate: u32,
    seconds: u64,
) -> Result<String, String> {
    let delay = ENGINE_MS.to_string();
    let (_engine, engine_url) = procs::spawn(
        engine,
        &["--listen", "127.0.0.1:0", "--head-delay-ms", &delay],
        "mock-upstream listening on ",
        None,
    )?;
    let run = Run {
        engine_url,
        scratch: run.scratch.join("tenants"),
        redis_url: run.redis_url.clone(),
        ..*run
    };
    std::fs::create_dir_all(&run.scratch).map_err(|e| format!("{}: {e}", run.scratch.display()))?;
    let config = run.scratch.join("tenants.toml");
    std::fs::write(
        &config,
        format!(
            "[tenants.keys]\n\"{}\" = \"alpha\"\n\"{}\" = \"bravo\"\n",
            clawback_sidecar::data_plane::tenant::key_hash(ALPHA_KEY),
            clawback_sidecar::data_plane::tenant::key_hash(BRAVO_KEY),
        ),
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    let config = config.display().to_string();
    let capacity = format!("limits.max_concurrent_requests={CAPACITY}");
    let mut rows = Vec::new();
    for share in ["0.5", "1"] {
        let data_dir = run
            .scratch
            .join(format!("share-{share}"))
            .display()
            .to_string();
        let share_arg = format!("limits.tenant_share={share}");
        let (_sidecar, url) = run.sidecar(&[
            "--config",
            &config,
            "--data-dir",
            &data_dir,
            "--set",
            &capacity,
            "--set",
            &share_arg,
        ])?;
        rows.push((share, phases(client, &url, rate, seconds).await));
    }
    let mut out = format!(
        "\n### Two tenants, one abusive\n\nOne sidecar (recording into its embedded store) serving \
         {CAPACITY} calls at once, an engine taking {ENGINE_MS} ms per call. Bravo sends {rate} \
         calls/s (open loop, {seconds} s) alone, then while alpha keeps {ABUSE} calls in flight \
         (closed loop, four times half the capacity, retrying at once whatever it is told). \
         Success: calls answered 200.\n\n\
         | `tenant_share` | bravo alone: p50 / p99 ms, success | bravo beside alpha: p50 / p99 ms, success | alpha: served / refused | bravo's p99 beside / alone |\n\
         |---|---|---|---|---|\n"
    );
    for (share, p) in &rows {
        out.push_str(&format!(
            "| {share} | {} / {}, {:.1} % | {} / {}, {:.1} % | {} / {} | {:.2}× |\n",
            ms(p.alone.percentile_ms(0.5)),
            ms(p.alone.percentile_ms(0.99)),
            success(&p.alone),
            ms(p.beside.percentile_ms(0.5)),
            ms(p.beside.percentile_ms(0.99)),
            success(&p.beside),
            p.abuser.sent - p.abuser.errors,
            p.abuser.errors,
            p.beside.percentile_ms(0.99) / p.alone.percentile_ms(0.99).max(f64::MIN_POSITIVE),
        ));
    }
    Ok(out)
}
