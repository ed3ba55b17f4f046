//! How far behind the trainer is, as the first sidecar's `/metrics` tells an operator: the
//! demo consumer group's ready entries (trajectories, groups) not handed to the trainer yet
//! (lag) and handed but not acked (pending: being trained, or waiting for a full batch).

/// The trainer's consumer group in the demo's `trainer.toml`.
pub const GROUP: &str = "demo";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    pub lag: u64,
    pub pending: u64,
}

/// The demo group's backlog over all tenants; `None` when the sidecar did not answer.
pub async fn backlog(client: &reqwest::Client, sidecar: &str) -> Option<Backlog> {
    let text = client
        .get(format!("{sidecar}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(parse(&text))
}

fn parse(metrics: &str) -> Backlog {
    let group = format!("group=\"{GROUP}\"");
    let mut backlog = Backlog::default();
    for line in metrics.lines().filter(|l| l.contains(&group)) {
        let value = || line.rsplit(' ').next()?.parse::<f64>().ok();
        if line.starts_with("clawback_datapool_lag{") {
            backlog.lag += value().unwrap_or(0.0) as u64;
        } else if line.starts_with("clawback_datapool_pending{") {
            backlog.pending += value().unwrap_or(0.0) as u64;
        }
    }
    backlog
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_groups_lag_and_pending_are_read_from_the_metrics() {
        let metrics = "# HELP clawback_datapool_lag Ready ...\n\
                       clawback_datapool_lag{group=\"demo\"} 3\n\
                       clawback_datapool_lag{group=\"other\"} 9\n\
                       clawback_datapool_pending{group=\"demo\"} 2\n";
        assert_eq!(parse(metrics), Backlog { lag: 3, pending: 2 });
    }
}
