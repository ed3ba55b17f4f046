//! One plugin call in a fresh store: instantiate, call, and turn whatever went wrong — a trap,
//! the fuel budget, the memory limit, the timeout backstop, an answer out of bounds — into a
//! [`Failure`] that says why. Nothing a plugin does fails the caller.

use std::sync::Arc;
use std::time::Duration;

use crate::bindings::{Evaluation, NextState, Step, Trajectory};
use crate::host::CallHost;
use crate::plugin::Plugin;
use crate::sandbox::{Sandbox, Stopped};

/// Longest hint a plugin may return, in bytes.
pub const HINT_CAP: usize = 4 << 10;
/// Most labels on one evaluation, and the longest key plus value, in bytes.
pub const LABELS_CAP: usize = 32;
pub const LABEL_CAP: usize = 256;

/// What a plugin is asked.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    Step(&'a Step, &'a NextState),
    Trajectory(&'a Trajectory),
}

/// Why a call produced no evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Low-cardinality kind, for metrics: `fuel`, `timeout`, `out_of_memory`, `trap`,
    /// `judge_budget`, `invalid_output`, `instantiate`, `sandbox`.
    pub kind: &'static str,
    /// The reason stored on the `filter_error` evaluation.
    pub reason: String,
}

impl Failure {
    fn new(kind: &'static str, reason: String) -> Self {
        Self { kind, reason }
    }

    /// Whether the call failed for the host's reasons, not the plugin's: the wall-clock
    /// backstop (a busy host, a slow judge) or a store the host could not set up. Such a call
    /// is tried again; what the plugin itself did (its fuel, its memory, a trap, its answer)
    /// would fail the same way again.
    pub fn is_the_hosts(&self) -> bool {
        matches!(self.kind, "timeout" | "sandbox")
    }
}

/// What one call gave, and the fuel it burnt.
pub struct Called {
    pub result: Result<Evaluation, Failure>,
    pub fuel_used: u64,
}

/// Runs `input` through `plugin` in a fresh store, within `timeout` of wall-clock time.
pub async fn run(
    sandbox: &Sandbox,
    plugin: &Arc<Plugin>,
    host: CallHost,
    input: Input<'_>,
    timeout: Duration,
) -> Called {
    let mut store = match sandbox.store(host) {
        Ok(store) => store,
        Err(error) => {
            return Called {
                result: Err(Failure::new("sandbox", error.to_string())),
                fuel_used: 0,
            }
        }
    };
    let called = tokio::time::timeout(timeout, async {
        let filter = plugin
            .instantiate(&mut store)
            .await
            .map_err(|e| (true, e))?;
        match input {
            Input::Step(step, next) => filter.call_evaluate_step(&mut store, step, next).await,
            Input::Trajectory(trajectory) => {
                filter
                    .call_evaluate_trajectory(&mut store, trajectory)
                    .await
            }
        }
        .map_err(|e| (false, e))
    })
    .await;
    let fuel_used = store
        .get_fuel()
        .map_or(0, |left| sandbox.fuel().saturating_sub(left));
    let state = store.data();
    let result = match called {
        Err(_) => Err(Failure::new(
            "timeout",
            format!("timeout: the call took over {}", humantime(timeout)),
        )),
        Ok(Ok(evaluation)) => check(evaluation),
        Ok(Err((instantiating, error))) => Err(match state.stop_reason(&error) {
            Some(Stopped::OutOfFuel(fuel)) => Failure::new(
                "fuel",
                format!("fuel: stopped after {fuel} units of work (the plugin's fuel budget)"),
            ),
            Some(Stopped::OutOfMemory(limit)) => Failure::new(
                "out_of_memory",
                format!(
                    "out of memory: the plugin's memory limit of {} MiB was reached",
                    limit >> 20
                ),
            ),
            None => match &state.host.trapped {
                Some(reason) => Failure::new("judge_budget", reason.clone()),
                None if instantiating => Failure::new(
                    "instantiate",
                    format!("cannot instantiate the plugin: {error:#}"),
                ),
                None => {
                    let trap = error
                        .downcast_ref::<wasmtime::Trap>()
                        .map_or_else(|| format!("{error}"), ToString::to_string);
                    let reason = match state.stderr_text() {
                        Some(stderr) => format!("trap: {trap}: {stderr}"),
                        None => format!("trap: {trap}"),
                    };
                    Failure::new("trap", reason)
                }
            },
        }),
    };
    Called { result, fuel_used }
}

/// Refuses an answer out of bounds: a reward outside [-1, 1], an oversized hint or labels.
fn check(evaluation: Evaluation) -> Result<Evaluation, Failure> {
    let invalid =
        |reason: String| Failure::new("invalid_output", format!("invalid output: {reason}"));
    if let Some(reward) = evaluation.reward {
        if !reward.is_finite() || !(-1.0..=1.0).contains(&reward) {
            return Err(invalid(format!("reward {reward} is outside [-1, 1]")));
        }
    }
    if let Some(hint) = &evaluation.hint {
        if hint.len() > HINT_CAP {
            return Err(invalid(format!(
                "a hint of {} bytes is over the cap of {HINT_CAP} bytes",
                hint.len()
            )));
        }
    }
    if evaluation.labels.len() > LABELS_CAP {
        return Err(invalid(format!(
            "{} labels are over the cap of {LABELS_CAP}",
            evaluation.labels.len()
        )));
    }
    if let Some((key, _)) = evaluation
        .labels
        .iter()
        .find(|(key, value)| key.len() + value.len() > LABEL_CAP)
    {
        return Err(invalid(format!(
            "label {:?} is over the cap of {LABEL_CAP} bytes",
            truncate(key, 32)
        )));
    }
    Ok(evaluation)
}

fn truncate(text: &str, cap: usize) -> &str {
    let mut end = text.len().min(cap);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `200ms`, `30s`.
fn humantime(duration: Duration) -> String {
    if duration.subsec_millis() == 0 && duration.as_secs() > 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluation(reward: Option<f64>, hint: Option<String>) -> Evaluation {
        Evaluation {
            reward,
            hint,
            labels: Vec::new(),
        }
    }

    #[test]
    fn answers_out_of_bounds_are_refused_with_the_reason() {
        let err = check(evaluation(Some(1.5), None)).unwrap_err();
        assert_eq!(err.kind, "invalid_output");
        assert!(err.reason.contains("outside [-1, 1]"), "{}", err.reason);
        assert!(check(evaluation(Some(f64::NAN), None)).is_err());
        let err = check(evaluation(None, Some("x".repeat(HINT_CAP + 1)))).unwrap_err();
        assert!(err.reason.contains("over the cap"), "{}", err.reason);
        assert!(check(evaluation(Some(-1.0), Some("Check the path.".into()))).is_ok());
    }
}
