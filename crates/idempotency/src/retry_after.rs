//! When a duplicate of a request in flight should come back: `Retry-After` from how long
//! attempts of the operation have recently taken, not from how long the lock has left.
//!
//! A lock lasts long enough for the slowest effect call (30 s by default), so "the rest of
//! the lock" sends a client away for far longer than a typical attempt takes. The estimate is
//! the 90th percentile of the last [`RecentDurations::WINDOW`] attempts, in whole seconds
//! rounded up, at least 1 and never more than the lock has left. Memory is fixed: one ring of
//! durations per operation, whatever clients send.

use std::sync::Mutex;
use std::time::Duration;

/// The durations of the most recent attempts of one operation.
#[derive(Debug, Default)]
pub struct RecentDurations {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    samples: Vec<Duration>,
    next: usize,
}

impl RecentDurations {
    /// How many recent attempts the estimate looks at.
    pub const WINDOW: usize = 64;

    /// Records how long one attempt took from its claim to its final answer.
    pub fn record(&self, took: Duration) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.samples.len() < Self::WINDOW {
            ring.samples.push(took);
        } else {
            let next = ring.next;
            ring.samples[next] = took;
        }
        ring.next = (ring.next + 1) % Self::WINDOW;
    }

    /// The 90th percentile of the recorded durations; `None` before the first.
    pub fn p90(&self) -> Option<Duration> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut sorted = ring.samples.clone();
        drop(ring);
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_unstable();
        // Nearest rank: the smallest sample at or above 90 % of them.
        let rank = (sorted.len() * 9).div_ceil(10).max(1);
        sorted.get(rank - 1).copied()
    }

    /// Seconds a duplicate should wait: the p90 rounded up, at least 1 (also with no history
    /// yet), at most `lock_left_secs`, the whole seconds left of the lock.
    pub fn retry_after_secs(&self, lock_left_secs: u64) -> u64 {
        let estimate = self.p90().map_or(1, |p90| {
            u64::try_from(p90.as_millis().div_ceil(1000)).unwrap_or(u64::MAX)
        });
        estimate.min(lock_left_secs).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn with_no_history_a_duplicate_comes_back_in_one_second() {
        assert_eq!(RecentDurations::default().retry_after_secs(30), 1);
    }

    #[test]
    fn the_estimate_is_the_p90_rounded_up() {
        let recent = RecentDurations::default();
        for _ in 0..9 {
            recent.record(ms(100));
        }
        recent.record(ms(2_100));
        assert_eq!(recent.p90(), Some(ms(100)));
        assert_eq!(recent.retry_after_secs(30), 1);
        recent.record(ms(2_100));
        // 11 samples: rank 10 is the first of the two slow ones.
        assert_eq!(recent.p90(), Some(ms(2_100)));
        assert_eq!(recent.retry_after_secs(30), 3);
    }

    #[test]
    fn the_estimate_never_exceeds_the_lock_nor_falls_below_one_second() {
        let recent = RecentDurations::default();
        recent.record(ms(60_000));
        assert_eq!(recent.retry_after_secs(12), 12);
        assert_eq!(recent.retry_after_secs(0), 1);
    }

    #[test]
    fn only_the_most_recent_window_counts() {
        let recent = RecentDurations::default();
        for _ in 0..RecentDurations::WINDOW {
            recent.record(ms(20_000));
        }
        for _ in 0..RecentDurations::WINDOW {
            recent.record(ms(500));
        }
        assert_eq!(recent.p90(), Some(ms(500)));
        assert_eq!(recent.retry_after_secs(30), 1);
    }
}
