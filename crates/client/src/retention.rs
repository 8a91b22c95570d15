//! How long the service holds a key, as far as the caller can know it: the rule that keeps a
//! resend from ever being a second operation.
//!
//! The service keeps a key for its retention (its `idempotency.ttl_secs`, a day by default)
//! counted from the key's final answer, and a key past it is fresh: the same request under it
//! is executed again. The final answer comes after the first send, so a key first sent at `t`
//! is held at least until `t + retention`, and a request that arrives before then is finished
//! or replayed, never made twice. After that the key may be gone, and only the service can say
//! whether it is (`GET /idempotency-keys/{key}`).
//!
//! The client cannot ask the service for its retention: it is told it
//! ([`Client::with_key_retention`](crate::Client::with_key_retention), a day by default, the
//! service's default). A retention shorter than the service's only makes the client ask
//! sooner; a longer one makes this rule late, so a service configured to keep keys for less
//! than a day needs its callers told so.

use std::time::{Duration, SystemTime};

use crate::types::{IdempotencyKeyRecord, KeyState};

/// The service's default retention of a key (`idempotency.ttl_secs`).
pub const DEFAULT_KEY_RETENTION: Duration = Duration::from_secs(86_400);

/// Kept between the last send and the end of the key's retention: for the caller's clock
/// stepping, and for a request still on its way. A minute, or a tenth of a shorter retention.
pub fn margin(retention: Duration) -> Duration {
    (retention / 10).min(Duration::from_secs(60))
}

/// Until when the service surely holds a key, by the caller's clock, less the margin: a
/// request under the key sent before then reaches a service that still knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    until: SystemTime,
}

impl Held {
    /// A key first sent at `first_sent` to a service that keeps keys for `retention`.
    pub fn since_first_send(first_sent: SystemTime, retention: Duration) -> Self {
        let end = first_sent + retention;
        Self {
            until: end.checked_sub(margin(retention)).unwrap_or(end),
        }
    }

    /// What the service's record of the key says, read at `service_now` by the service's
    /// clock (its `Date`) and at `now` by the caller's: a key in flight is held for a whole
    /// retention after its final answer, which has not come yet; a finished one until its
    /// `expires_at`. `None` when the record does not say.
    pub fn from_record(
        record: &IdempotencyKeyRecord,
        service_now: SystemTime,
        now: SystemTime,
        retention: Duration,
    ) -> Option<Self> {
        let left = match record.state {
            KeyState::Pending => retention,
            KeyState::Completed | KeyState::Failed => {
                let expires = chrono::DateTime::parse_from_rfc3339(record.expires_at.as_deref()?);
                let expires = SystemTime::from(expires.ok()?.to_utc());
                // Both times by the service's clock: the caller's may be set otherwise.
                expires
                    .duration_since(service_now)
                    .unwrap_or(Duration::ZERO)
            }
        };
        let until = now + left;
        Some(Self {
            until: until.checked_sub(margin(retention)).unwrap_or(until),
        })
    }

    /// How long sends may go on from `now`: until the key's time is up, and at most
    /// `deadline`. Zero when it is up.
    pub fn window(&self, now: SystemTime, deadline: Duration) -> Duration {
        let left = self.until.duration_since(now).unwrap_or(Duration::ZERO);
        left.min(deadline)
    }

    /// Whether sends for a whole `deadline` from `now` all reach the service while it holds
    /// the key.
    pub fn covers(&self, now: SystemTime, deadline: Duration) -> bool {
        now + deadline <= self.until
    }

    /// The last moment a resend with `deadline` may start and still be covered.
    pub fn resend_before(&self, deadline: Duration) -> Option<SystemTime> {
        self.until.checked_sub(deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = DEFAULT_KEY_RETENTION;
    const MINUTE: Duration = Duration::from_secs(60);

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000 + secs)
    }

    fn record(state: KeyState, expires_at: Option<&str>) -> IdempotencyKeyRecord {
        IdempotencyKeyRecord {
            object: "idempotency_key".to_owned(),
            key: "k".to_owned(),
            operation: crate::types::KeyOperation::Charge,
            state,
            recovery_point: crate::types::RecoveryPoint::Finished,
            attempts: 1,
            response_status: None,
            response_schema_version: None,
            fingerprint: String::new(),
            locked_until: None,
            created_at: String::new(),
            expires_at: expires_at.map(str::to_owned),
        }
    }

    #[test]
    fn the_margin_is_a_minute_or_a_tenth_of_a_short_retention() {
        assert_eq!(margin(DAY), MINUTE);
        assert_eq!(margin(Duration::from_secs(6)), Duration::from_millis(600));
    }

    #[test]
    fn a_key_is_held_for_its_retention_from_its_first_send_less_the_margin() {
        let held = Held::since_first_send(at(0), DAY);
        let two_minutes = 2 * MINUTE;
        // A resend whose every attempt ends before the margin is covered; one a second later
        // is not, and gets only what is left.
        let last_start = at(86_400 - 60 - 120);
        assert!(held.covers(last_start, two_minutes));
        assert!(!held.covers(last_start + Duration::from_secs(1), two_minutes));
        assert_eq!(held.resend_before(two_minutes), Some(last_start));
        assert_eq!(
            held.window(at(86_400 - 60 - 30), two_minutes),
            Duration::from_secs(30)
        );
        assert_eq!(held.window(at(0), two_minutes), two_minutes);
        // After the retention, nothing may be sent without asking.
        assert_eq!(held.window(at(86_400), two_minutes), Duration::ZERO);
        assert_eq!(held.window(at(90_000), two_minutes), Duration::ZERO);
    }

    #[test]
    fn the_service_s_record_says_how_long_it_still_holds_the_key() {
        // Expiring in an hour by the service's clock, whatever the caller's clock says.
        let expires = "2026-05-28T21:26:40.000000Z";
        let service_now =
            SystemTime::from(chrono::DateTime::parse_from_rfc3339(expires).expect("a time"))
                - Duration::from_secs(3_600);
        let completed = record(KeyState::Completed, Some(expires));
        let held = Held::from_record(&completed, service_now, at(0), DAY).expect("held");
        assert_eq!(held.window(at(0), DAY), Duration::from_secs(3_600 - 60));
        let failed = record(KeyState::Failed, Some(expires));
        assert_eq!(
            Held::from_record(&failed, service_now, at(0), DAY),
            Some(held)
        );
        // Expired by the service's clock: nothing is left.
        let late = service_now + Duration::from_secs(7_200);
        let gone = Held::from_record(&completed, late, at(0), DAY).expect("read");
        assert_eq!(gone.window(at(0), DAY), Duration::ZERO);
        // In flight: a whole retention after the answer still to come.
        let pending = record(KeyState::Pending, None);
        let held = Held::from_record(&pending, service_now, at(0), DAY).expect("held");
        assert_eq!(held.window(at(0), 2 * DAY), DAY - MINUTE);
        // A finished record without a readable expiry says nothing.
        for expires in [None, Some("tomorrow")] {
            let unreadable = record(KeyState::Completed, expires);
            assert_eq!(
                Held::from_record(&unreadable, service_now, at(0), DAY),
                None
            );
        }
    }
}
