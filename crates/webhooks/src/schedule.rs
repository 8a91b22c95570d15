//! When a delivery that failed is tried again: a fixed schedule over about three days, as
//! payment APIs retry (Stripe for up to three days; Svix's schedule is the model), each delay
//! spread by a jitter so that the deliveries of one burst do not all come back at once, and
//! never sooner than the endpoint's `Retry-After` asks, up to a cap. A test compresses the
//! whole schedule by a divisor.

use std::time::Duration;

/// The delays before the second attempt, the third, and so on: ten attempts over 75.6 hours.
const STANDARD: [Duration; 9] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(24 * 3600),
    Duration::from_secs(24 * 3600),
];

/// The longest wait a `Retry-After` can ask for, before compression.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(6 * 3600);

/// How far a delay may be spread either way: a tenth of it.
const JITTER: f64 = 0.1;

/// The retry schedule of deliveries.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySchedule {
    delays: Vec<Duration>,
    retry_after_cap: Duration,
}

impl Default for RetrySchedule {
    fn default() -> Self {
        Self {
            delays: STANDARD.to_vec(),
            retry_after_cap: RETRY_AFTER_CAP,
        }
    }
}

impl RetrySchedule {
    /// The schedule with every delay, and the `Retry-After` cap, divided by `divisor` (at least
    /// 1): three days in a few seconds for a test.
    pub fn compressed(divisor: u32) -> Self {
        let divisor = divisor.max(1);
        let standard = Self::default();
        Self {
            delays: standard
                .delays
                .iter()
                .map(|delay| *delay / divisor)
                .collect(),
            retry_after_cap: standard.retry_after_cap / divisor,
        }
    }

    /// How many attempts a delivery gets in all, the first among them.
    pub fn attempts(&self) -> u32 {
        u32::try_from(self.delays.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }

    /// The whole span from the first attempt to the last, without jitter.
    pub fn span(&self) -> Duration {
        self.delays.iter().sum()
    }

    /// The delay before the next attempt after attempt `failed` (1 for the first) failed;
    /// `None` when it was the last. `spread` is a sample in `[0, 1)` that places the delay
    /// within its jitter (0.5 is the scheduled delay itself); `retry_after` is what the endpoint
    /// asked for, honoured up to the cap and never making the wait shorter than scheduled.
    pub fn next_delay(
        &self,
        failed: u32,
        retry_after: Option<Duration>,
        spread: f64,
    ) -> Option<Duration> {
        let index = usize::try_from(failed.checked_sub(1)?).ok()?;
        let scheduled = *self.delays.get(index)?;
        let factor = 1.0 + JITTER * (2.0 * spread.clamp(0.0, 1.0) - 1.0);
        let jittered = scheduled.mul_f64(factor);
        let asked = retry_after.map_or(Duration::ZERO, |after| after.min(self.retry_after_cap));
        Some(jittered.max(asked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_attempts_over_about_three_days() {
        let schedule = RetrySchedule::default();
        assert_eq!(schedule.attempts(), 10);
        assert_eq!(schedule.span(), Duration::from_secs(272_105));
        assert!(schedule.span() > Duration::from_secs(3 * 86_400));
        assert_eq!(
            schedule.next_delay(1, None, 0.5),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            schedule.next_delay(9, None, 0.5),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(schedule.next_delay(10, None, 0.5), None, "the last attempt");
        assert_eq!(schedule.next_delay(0, None, 0.5), None);
    }

    #[test]
    fn the_jitter_spreads_a_delay_by_a_tenth_either_way() {
        let schedule = RetrySchedule::default();
        let at = |spread| schedule.next_delay(3, None, spread);
        assert_eq!(at(0.0), Some(Duration::from_secs(1_620)));
        assert_eq!(at(1.0), Some(Duration::from_secs(1_980)));
        assert_eq!(at(0.5), Some(Duration::from_secs(1_800)));
    }

    #[test]
    fn retry_after_makes_a_wait_longer_up_to_its_cap_never_shorter() {
        let schedule = RetrySchedule::default();
        let hour = Duration::from_secs(3600);
        assert_eq!(
            schedule.next_delay(1, Some(Duration::from_secs(60)), 0.5),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            schedule.next_delay(1, Some(100 * hour), 0.5),
            Some(6 * hour),
            "capped"
        );
        assert_eq!(
            schedule.next_delay(5, Some(Duration::from_secs(1)), 0.5),
            Some(5 * hour),
            "never sooner than scheduled"
        );
    }

    #[test]
    fn a_compressed_schedule_keeps_its_shape() {
        let schedule = RetrySchedule::compressed(10_000);
        assert_eq!(schedule.attempts(), 10);
        assert_eq!(
            schedule.next_delay(1, None, 0.5),
            Some(Duration::from_micros(500))
        );
        assert_eq!(
            schedule.next_delay(9, None, 0.5),
            Some(Duration::from_millis(8_640))
        );
        assert_eq!(
            schedule.next_delay(1, Some(Duration::from_secs(3600)), 0.5),
            Some(Duration::from_millis(2_160)),
            "the cap is compressed too"
        );
    }
}
