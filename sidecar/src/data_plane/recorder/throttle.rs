//! At most one log line per interval for events that can come thousands of times a second (a
//! full queue, a datapool that refuses writes): the metrics count every one, the log says it is
//! happening and how often.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LogThrottle {
    epoch: Instant,
    interval: Duration,
    /// Milliseconds since `epoch` of the last line, plus one (0: never).
    last_ms: AtomicU64,
    /// Events since the last line.
    pending: AtomicU64,
}

impl LogThrottle {
    pub fn new(interval: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            interval,
            last_ms: AtomicU64::new(0),
            pending: AtomicU64::new(0),
        }
    }

    /// Counts an event; returns how many happened since the last line when it is time for one.
    pub fn event(&self) -> Option<u64> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= self.interval.as_millis() as u64;
        if due
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.pending.swap(0, Ordering::Relaxed));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_gives_one_line_with_its_count() {
        let throttle = LogThrottle::new(Duration::from_secs(60));
        assert_eq!(throttle.event(), Some(1));
        for _ in 0..999 {
            assert_eq!(throttle.event(), None);
        }
    }
}
