//! A circuit breaker per plugin version: after `failures` failed calls in a row the plugin is
//! switched off for `cooldown`; then one call tries it again (half-open). A success closes it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::BreakerConfig;

#[derive(Debug)]
struct State {
    consecutive: u32,
    open_until: Option<Instant>,
    trial_in_flight: bool,
}

#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
}

/// What a recorded outcome changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    /// The plugin was just switched off.
    Opened,
    /// A trial call succeeded: the plugin is back on.
    Closed,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                consecutive: 0,
                open_until: None,
                trial_in_flight: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call may run now. While open, `false`; once the cooldown is over, `true` for
    /// one trial call at a time.
    pub fn allow(&self) -> bool {
        let mut state = self.state();
        match state.open_until {
            None => true,
            Some(until) if Instant::now() >= until && !state.trial_in_flight => {
                state.trial_in_flight = true;
                true
            }
            Some(_) => false,
        }
    }

    /// Whether the plugin is switched off right now.
    pub fn is_open(&self) -> bool {
        self.state().open_until.is_some()
    }

    pub fn record(&self, success: bool) -> Change {
        let mut state = self.state();
        let was_open = state.open_until.is_some();
        state.trial_in_flight = false;
        if success {
            state.consecutive = 0;
            state.open_until = None;
            return if was_open {
                Change::Closed
            } else {
                Change::None
            };
        }
        state.consecutive = state.consecutive.saturating_add(1);
        if was_open || (self.config.failures > 0 && state.consecutive >= self.config.failures) {
            state.open_until = Some(Instant::now() + self.config.cooldown);
            return if was_open {
                Change::None
            } else {
                Change::Opened
            };
        }
        Change::None
    }

    pub fn cooldown(&self) -> Duration {
        self.config.cooldown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_that_keeps_failing_is_switched_off_then_tried_again() {
        let breaker = Breaker::new(BreakerConfig {
            failures: 3,
            cooldown: Duration::ZERO,
        });
        assert_eq!(breaker.record(false), Change::None);
        assert_eq!(breaker.record(false), Change::None);
        assert_eq!(breaker.record(false), Change::Opened);
        assert!(breaker.is_open());
        // Cooldown over: one trial at a time.
        assert!(breaker.allow());
        assert!(!breaker.allow());
        assert_eq!(breaker.record(true), Change::Closed);
        assert!(breaker.allow() && !breaker.is_open());
    }

    #[test]
    fn an_open_breaker_refuses_calls_during_its_cooldown() {
        let breaker = Breaker::new(BreakerConfig {
            failures: 1,
            cooldown: Duration::from_secs(3600),
        });
        assert_eq!(breaker.record(false), Change::Opened);
        assert!(!breaker.allow());
    }
}
