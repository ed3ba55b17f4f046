//! Recording with one filter plugin loaded against recording without it, on two-turn
//! conversations whose first step the plugin evaluates; the evaluations are counted from the
//! sidecar's own metrics.

use std::time::Duration;

use bytes::Bytes;
use clawback_tests::engine_json::{self, Reply};
use clawback_tests::load::{closed_loop, open_loop, HttpClient, PhaseResult, Target, Turn};
use serde_json::json;

use crate::counts::Counts;
use crate::{ms, warm_up};

/// How long the filter queue may take to drain after a phase.
const DRAIN: Duration = Duration::from_secs(10);

/// A two-turn tool-using conversation as an agent sends it: the model calls a tool; the second
/// turn repeats the first with the engine's reply and the tool's result appended, and ends the
/// trajectory. The second turn is the first step's next state, so a filter plugin evaluates it.
fn conversation() -> Vec<Turn> {
    let first = json!({
        "model": "mock-llama",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Use tools when they help."},
            {"role": "user", "content": "What's the temperature in Paris in Celsius?"}
        ],
        "tools": [{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
            }
        }],
        "max_completion_tokens": 64
    });
    // What the mock engine answers to the first turn, exactly as it sends it.
    let reply = Reply::for_request(&first);
    let call_id = match &reply {
        Reply::ToolCall { id, .. } => id.clone(),
        Reply::Text(_) => "call_0".to_owned(),
    };
    let answer = engine_json::chat_completion("chatcmpl-bench", &first, &reply);
    let mut second = first.clone();
    if let Some(messages) = second["messages"].as_array_mut() {
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "tool", "tool_call_id": call_id,
                             "content": "{\"city\":\"Paris\",\"temperature\":21,\"unit\":\"celsius\"}"}));
    }
    vec![
        Turn {
            body: Bytes::from(first.to_string()),
            headers: Vec::new(),
        },
        Turn {
            body: Bytes::from(second.to_string()),
            headers: vec![("x-clawback-done", "true")],
        },
    ]
}

/// The two sidecars the plugin comparison measures: both record into the same Redis.
pub struct Sidecars<'a> {
    pub recording: &'a str,
    pub filtered: &'a str,
}

/// One phase of the plugin comparison, on both sidecars.
struct Compared {
    without: PhaseResult,
    with: PhaseResult,
    /// The plugin sidecar's counts over its phase, when the phase ended.
    at_end: Counts,
    /// The same once its filter queue drained, `waited` after the phase ended.
    drained: Counts,
    waited: Duration,
    /// Writes the sidecar without the plugin dropped in its phase.
    plain_dropped: f64,
}

impl Compared {
    /// What the plugin did in the phase, in words.
    fn evaluations(&self) -> String {
        let (at_end, drained) = (self.at_end, self.drained);
        format!(
            "conversations answered {:.0}; plugin calls by the phase's end: {:.0} scored, {:.0} no \
             opinion, {:.0} filter_error; once the filter queue drained ({} ms later): {:.0} \
             scored; steps dropped by the full filter queue: {:.0}; recorder writes dropped \
             (full queue: the datapool is slower than the traffic) without / with the plugin: \
             {:.0} / {:.0}",
            (self.with.sent - self.with.errors) as f64 / 2.0,
            at_end.scored,
            at_end.no_opinion,
            at_end.filter_error,
            self.waited.as_millis(),
            drained.scored,
            drained.filter_dropped,
            self.plain_dropped,
            drained.records_dropped,
        )
    }
}

/// One phase of the plugin comparison: the sidecar without the plugin, then the one with it,
/// each after a warm-up; the plugin sidecar's counts are taken after its warm-up, when its
/// phase ends, and once its filter queue drained.
async fn compare(
    client: &HttpClient,
    (plain, plain_base): (&Target, &str),
    (filtered, base): (&Target, &str),
    run: impl Fn(HttpClient, Target) -> tokio::task::JoinHandle<PhaseResult>,
) -> Result<Compared, String> {
    warm_up(client, plain).await;
    let plain_before = Counts::scrape(client, plain_base).await?;
    let without = run(client.clone(), plain.clone())
        .await
        .map_err(|e| format!("a load phase failed: {e}"))?;
    let plain_after = Counts::scrape(client, plain_base).await?;
    warm_up(client, filtered).await;
    let (before, _) = Counts::settled(client, base, DRAIN).await?;
    let with = run(client.clone(), filtered.clone())
        .await
        .map_err(|e| format!("a load phase failed: {e}"))?;
    let at_end = Counts::scrape(client, base).await?.since(before);
    let (drained, waited) = Counts::settled(client, base, DRAIN).await?;
    Ok(Compared {
        without,
        with,
        at_end,
        drained: drained.since(before),
        waited,
        plain_dropped: plain_after.since(plain_before).records_dropped,
    })
}

/// Recording with one plugin loaded against recording without it, on the same two-turn
/// conversations: one open-loop rate and the closed-loop maximum; each phase reports the
/// evaluations the plugin sidecar counted (during the phase, and once its filter queue drained).
pub async fn with_plugin(
    client: &HttpClient,
    sidecars: &Sidecars<'_>,
    plugin: &str,
    rate: u32,
    concurrency: usize,
    seconds: u64,
) -> Result<String, String> {
    let phase = Duration::from_secs(seconds);
    let target = |base: &str| Target {
        url: format!("{base}/v1/chat/completions"),
        turns: conversation(),
        session_header: Some("x-clawback-session"),
        first_byte: false,
    };
    let (plain, filtered) = (target(sidecars.recording), target(sidecars.filtered));
    let mut report = format!(
        "\n#### Recording + one filter plugin (`{plugin}`)\n\n\
         Two-turn tool-using conversations, each in its own session (`x-clawback-session`): the \
         model calls a tool, the second turn sends the tool's result and ends the trajectory, so \
         every conversation gives one step with a next state for the plugin. *recording*: the \
         recording sidecar above; *+ plugin*: the same with `--plugins` holding only \
         `{plugin}.wasm` (filters at their defaults). Latency per call in ms, {}s per phase.\n\n",
        seconds
    );
    let c = compare(
        client,
        (&plain, sidecars.recording),
        (&filtered, sidecars.filtered),
        |c, t| tokio::spawn(async move { open_loop(&c, &t, rate, phase).await }),
    )
    .await?;
    let (without, with) = (&c.without, &c.with);
    let p = |r: &PhaseResult, q| r.percentile_ms(q);
    report.push_str(&format!(
        "Open loop at {rate} req/s: recording p50 / p99 / p99.9 {} / {} / {}; + plugin {} / {} / {} \
         (added p50 / p99 {} / {}); errors {}/{}; {}.\n",
        ms(p(without, 0.5)), ms(p(without, 0.99)), ms(p(without, 0.999)),
        ms(p(with, 0.5)), ms(p(with, 0.99)), ms(p(with, 0.999)),
        ms(p(with, 0.5) - p(without, 0.5)), ms(p(with, 0.99) - p(without, 0.99)),
        without.errors, with.errors,
        c.evaluations(),
    ));
    eprintln!("plugin, rate {rate}: done");

    let c = compare(
        client,
        (&plain, sidecars.recording),
        (&filtered, sidecars.filtered),
        |c, t| tokio::spawn(async move { closed_loop(&c, &t, concurrency, phase).await }),
    )
    .await?;
    report.push_str(&format!(
        "\nMaximum throughput, closed loop with {concurrency} conversations in flight: recording \
         {:.0} req/s; + plugin {:.0} req/s (**{:.0} %** of recording); errors {}/{}; {}.\n",
        c.without.throughput(),
        c.with.throughput(),
        100.0 * c.with.throughput() / c.without.throughput(),
        c.without.errors,
        c.with.errors,
        c.evaluations(),
    ));
    eprintln!("plugin, closed loop: done");
    Ok(report)
}
