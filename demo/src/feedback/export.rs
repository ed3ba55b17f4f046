//! What the datapool holds of a tenant's sessions, read back as a trainer from outside would
//! read it: the sidecar's export (`GET /tenants/{t}/export`, one row per trainable step with
//! its reward and hint). It shows the plugins' work from the stored data, not from the trainer.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

/// The recorded steps of one tenant.
#[derive(Debug, Default, Serialize)]
pub struct Recorded {
    /// Trainable steps of completed trajectories.
    pub steps: u64,
    pub rewarded: u64,
    pub negative: u64,
    pub positive: u64,
    pub hinted: u64,
    /// The hints, most frequent first (the first few).
    pub hints: Vec<(String, u64)>,
}

/// Reads `tenant`'s export from `sidecar`; what could not be read is left at zero.
pub async fn recorded(
    client: &reqwest::Client,
    sidecar: &str,
    admin_token: &str,
    tenant: &str,
) -> Result<Recorded, String> {
    let request = client
        .get(format!("{sidecar}/tenants/{tenant}/export"))
        .bearer_auth(admin_token);
    let body = crate::chat::success_body(request, &format!("export of {tenant}")).await?;
    Ok(count(&body))
}

fn count(jsonl: &str) -> Recorded {
    let mut recorded = Recorded::default();
    let mut hints: HashMap<String, u64> = HashMap::new();
    for row in jsonl
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
    {
        recorded.steps += 1;
        if let Some(reward) = row["reward"].as_f64() {
            recorded.rewarded += 1;
            recorded.negative += u64::from(reward < 0.0);
            recorded.positive += u64::from(reward > 0.0);
        }
        if let Some(hint) = row["hint"].as_str() {
            recorded.hinted += 1;
            *hints.entry(hint.to_owned()).or_default() += 1;
        }
    }
    let mut hints: Vec<(String, u64)> = hints.into_iter().collect();
    hints.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    hints.truncate(5);
    recorded.hints = hints;
    recorded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_counted_by_reward_and_hint() {
        let rows = [
            r#"{"reward": -1.0, "hint": "Answer in capital letters."}"#,
            r#"{"reward": 1.0, "hint": null}"#,
            r#"{"reward": null, "hint": "Answer in capital letters."}"#,
            r#"{"reward": 0.0, "hint": "Use capital letters."}"#,
        ]
        .join("\n");
        let recorded = count(&rows);
        assert_eq!(
            (
                recorded.steps,
                recorded.rewarded,
                recorded.negative,
                recorded.positive
            ),
            (4, 3, 1, 1)
        );
        assert_eq!(recorded.hinted, 3);
        assert_eq!(
            recorded.hints[0],
            ("Answer in capital letters.".to_owned(), 2)
        );
    }
}
