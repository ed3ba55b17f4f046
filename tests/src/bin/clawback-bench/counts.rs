//! What a sidecar's own `/metrics` says about its recorder and its filters: how many served
//! calls became steps, how many of those the datapool has stored, what the plugins did.

use std::time::{Duration, Instant};

use bytes::Bytes;
use clawback_tests::load::HttpClient;
use http_body_util::{BodyExt, Full};

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    /// Calls turned into steps and queued for the datapool.
    pub recorded: f64,
    /// Steps the datapool accepted.
    pub stored: f64,
    /// Writes the recorder dropped (any reason).
    pub records_dropped: f64,
    /// Plugin calls by outcome.
    pub scored: f64,
    pub no_opinion: f64,
    pub filter_error: f64,
    /// Steps not evaluated because the filter queue was full.
    pub filter_dropped: f64,
}

impl Counts {
    pub async fn scrape(client: &HttpClient, base: &str) -> Result<Self, String> {
        let request = http::Request::get(format!("{base}/metrics"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{base}/metrics: {e}"))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{base}/metrics: {e}"))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        let calls = |outcome: &str| {
            sum(
                &text,
                "clawback_filter_calls_total",
                &format!("outcome=\"{outcome}\""),
            )
        };
        Ok(Self {
            recorded: sum(&text, "clawback_steps_recorded_total", ""),
            stored: sum(&text, "clawback_steps_stored_total", ""),
            records_dropped: sum(&text, "clawback_records_dropped_total", ""),
            scored: calls("score"),
            no_opinion: calls("no_opinion"),
            filter_error: calls("filter_error"),
            filter_dropped: sum(&text, "clawback_filter_dropped_total", ""),
        })
    }

    pub fn since(self, before: Self) -> Self {
        Self {
            recorded: self.recorded - before.recorded,
            stored: self.stored - before.stored,
            records_dropped: self.records_dropped - before.records_dropped,
            scored: self.scored - before.scored,
            no_opinion: self.no_opinion - before.no_opinion,
            filter_error: self.filter_error - before.filter_error,
            filter_dropped: self.filter_dropped - before.filter_dropped,
        }
    }

    /// Scrapes until two scrapes 200 ms apart agree (the recorder and the filter queue
    /// drained), at most `within`; the counts and how long it took.
    pub async fn settled(
        client: &HttpClient,
        base: &str,
        within: Duration,
    ) -> Result<(Self, Duration), String> {
        let started = Instant::now();
        let mut last = Self::scrape(client, base).await?;
        while started.elapsed() < within {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = Self::scrape(client, base).await?;
            if now == last && now.stored >= now.recorded {
                break;
            }
            last = now;
        }
        Ok((last, started.elapsed()))
    }
}

/// The sum of a Prometheus text exposition's samples of `name` whose labels contain `label`.
fn sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter(|rest| rest.starts_with(['{', ' ']) && rest.contains(label))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
