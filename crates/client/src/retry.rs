//! When to send a request again, and after how long: the whole retry policy, in one place.
//!
//! Retrying is safe only because every attempt of one logical operation carries the same
//! `Idempotency-Key` (the client makes it once, before the first send), so the service executes
//! the operation at most once and replays its answer to every later attempt. What is retried is
//! what says "the outcome is not final": a connection that failed or timed out (the request may
//! or may not have reached the service), `409 idempotency_key_in_use` (another attempt holds the
//! key), `408`, `429`, and the `5xx` the service and the proxies in front of it answer. Nothing
//! else is: a `400`, `401`, `402`, `403`, `404` or `422` is the same however often it is asked.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The code of the `409` that says another attempt holds the key.
pub const KEY_IN_USE: &str = "idempotency_key_in_use";

/// How long to keep trying, and how long to wait between tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How long one attempt may take, connecting to the last byte of the answer.
    pub attempt_timeout: Duration,
    /// How long the logical operation may take, all attempts and waits included. At the
    /// deadline the client stops and says the outcome is unknown, with the key to resume it.
    pub deadline: Duration,
    /// The first backoff's ceiling; each retry doubles it, up to `max_backoff`.
    pub base_backoff: Duration,
    /// The largest ceiling of a backoff the client chooses itself.
    pub max_backoff: Duration,
    /// `Prefer: wait=N`: ask the service to wait up to N seconds (at most 10) for an attempt
    /// in flight under the key instead of answering `409` at once.
    pub prefer_wait_secs: Option<u8>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(120),
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            prefer_wait_secs: None,
        }
    }
}

/// What an answer means for the logical operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The answer is final: a success, or an error that a retry would only repeat.
    Final,
    /// The outcome is not final: send the same request again under the same key.
    Retry,
}

/// Whether an answer of `status` (with the problem's `code`, when it has one) is final.
pub fn verdict(status: StatusCode, code: Option<&str>) -> Verdict {
    match status.as_u16() {
        // Another attempt holds the key. The other 409s (a key of another request version, an
        // exception another resolution works on) are final.
        409 if code == Some(KEY_IN_USE) => Verdict::Retry,
        408 | 429 | 500 | 502 | 503 | 504 => Verdict::Retry,
        _ => Verdict::Final,
    }
}

impl RetryPolicy {
    /// How long to wait before retry number `retry` (1 for the first retry). `Retry-After`,
    /// when the answer gave one, is honoured as given. Otherwise the wait is "full jitter":
    /// uniform between zero and a ceiling that doubles with each retry up to `max_backoff`, so
    /// that callers who failed together do not come back together. `unit` is a uniform draw
    /// from `[0, 1)`.
    pub fn backoff(&self, retry: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        if let Some(after) = retry_after {
            return after;
        }
        let doublings = retry.saturating_sub(1).min(30);
        let ceiling = self
            .base_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff);
        ceiling.mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// The `Retry-After` of an answer, in delay-seconds or as an HTTP date; `None` when absent or
/// unreadable (a date in the past is no wait).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn what_is_not_final_is_retried_and_nothing_else() {
        for status in [408, 429, 500, 502, 503, 504] {
            let status = StatusCode::from_u16(status).expect("status");
            assert_eq!(verdict(status, None), Verdict::Retry, "{status}");
        }
        let conflict = StatusCode::CONFLICT;
        assert_eq!(verdict(conflict, Some(KEY_IN_USE)), Verdict::Retry);
        assert_eq!(
            verdict(conflict, Some("idempotency_key_incomparable")),
            Verdict::Final
        );
        assert_eq!(
            verdict(conflict, Some("exception_being_resolved")),
            Verdict::Final
        );
        assert_eq!(verdict(conflict, None), Verdict::Final);
        for status in [200, 201, 400, 401, 402, 403, 404, 405, 413, 415, 422, 431] {
            let status = StatusCode::from_u16(status).expect("status");
            assert_eq!(verdict(status, None), Verdict::Final, "{status}");
        }
    }

    #[test]
    fn retry_after_is_honoured_in_seconds_and_as_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers, now), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        headers.insert(RETRY_AFTER, HeaderValue::from_str(&later).expect("date"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(7)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(7));
        headers.insert(RETRY_AFTER, HeaderValue::from_str(&earlier).expect("date"));
        assert_eq!(retry_after(&headers, now), Some(Duration::ZERO));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers, now), None);

        let policy = RetryPolicy::default();
        let given = Some(Duration::from_secs(4));
        assert_eq!(policy.backoff(1, given, 0.0), Duration::from_secs(4));
        assert_eq!(policy.backoff(9, given, 0.99), Duration::from_secs(4));
    }

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_capped_ceiling() {
        let policy = RetryPolicy {
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1_000),
            ..RetryPolicy::default()
        };
        let ceilings = [100, 200, 400, 800, 1_000, 1_000];
        for (retry, ceiling) in (1..).zip(ceilings) {
            let ceiling = Duration::from_millis(ceiling);
            assert_eq!(policy.backoff(retry, None, 0.0), Duration::ZERO);
            assert_eq!(policy.backoff(retry, None, 0.5), ceiling / 2);
            assert!(policy.backoff(retry, None, 0.999_999) < ceiling);
            let draws: Vec<Duration> = (0..200)
                .map(|_| policy.backoff(retry, None, rand::random::<f64>()))
                .collect();
            assert!(draws.iter().all(|draw| *draw < ceiling), "{draws:?}");
            // Spread over the whole range, not bunched: some in each half.
            assert!(draws.iter().any(|draw| *draw < ceiling / 2));
            assert!(draws.iter().any(|draw| *draw >= ceiling / 2));
        }
        assert_eq!(
            policy.backoff(u32::MAX, None, 0.5),
            Duration::from_millis(500)
        );
    }
}
