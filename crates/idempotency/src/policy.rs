//! How long a key is retained and how long one attempt may hold it.

use std::time::Duration;

/// The retention and locking policy, validated once at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyPolicy {
    /// How long a finished record is replayed; after that the key is fresh again.
    pub ttl: Duration,
    /// How long one attempt owns a pending record before another may take it over.
    pub lock_timeout: Duration,
}

impl IdempotencyPolicy {
    /// The contract's default retention: 24 hours.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
    /// The default lock: long enough for a slow effect call, short enough for a prompt retry.
    pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

    /// Checks the policy against the effect port's own idempotency window: a record must not
    /// outlive the effect port's memory of its key, or a late resume could make the effect again.
    pub fn new(
        ttl: Duration,
        lock_timeout: Duration,
        effect_key_window: Duration,
    ) -> Result<Self, PolicyError> {
        if ttl.is_zero() {
            return Err(PolicyError::ZeroTtl);
        }
        if lock_timeout.is_zero() {
            return Err(PolicyError::ZeroLockTimeout);
        }
        if ttl <= lock_timeout {
            return Err(PolicyError::TtlNotLongerThanLock {
                ttl_secs: ttl.as_secs(),
                lock_secs: lock_timeout.as_secs(),
            });
        }
        if ttl > effect_key_window {
            return Err(PolicyError::TtlBeyondEffectKeyWindow {
                ttl_secs: ttl.as_secs(),
                window_secs: effect_key_window.as_secs(),
            });
        }
        Ok(Self { ttl, lock_timeout })
    }
}

impl Default for IdempotencyPolicy {
    fn default() -> Self {
        Self {
            ttl: Self::DEFAULT_TTL,
            lock_timeout: Self::DEFAULT_LOCK_TIMEOUT,
        }
    }
}

/// An inconsistent policy. A service names its own settings when it reports one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("the retention must be longer than 0")]
    ZeroTtl,
    #[error("the lock timeout must be longer than 0")]
    ZeroLockTimeout,
    #[error(
        "the retention ({ttl_secs} s) must be longer than the lock timeout ({lock_secs} s): a \
         record must outlive the attempt that holds it"
    )]
    TtlNotLongerThanLock { ttl_secs: u64, lock_secs: u64 },
    #[error(
        "the retention ({ttl_secs} s) must not exceed the effect key window ({window_secs} s): a \
         retry after the effect port forgot its key could make the effect twice"
    )]
    TtlBeyondEffectKeyWindow { ttl_secs: u64, window_secs: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);
    const LOCK: Duration = Duration::from_secs(30);

    #[test]
    fn a_ttl_within_the_effect_key_window_is_accepted() {
        assert!(IdempotencyPolicy::new(DAY, LOCK, DAY).is_ok());
    }

    #[test]
    fn a_ttl_longer_than_the_effect_key_window_is_refused() {
        let err = IdempotencyPolicy::new(DAY * 2, LOCK, DAY);
        assert!(matches!(
            err,
            Err(PolicyError::TtlBeyondEffectKeyWindow { .. })
        ));
    }

    #[test]
    fn a_ttl_not_longer_than_the_lock_is_refused() {
        for ttl in [LOCK, LOCK / 2] {
            assert!(matches!(
                IdempotencyPolicy::new(ttl, LOCK, DAY),
                Err(PolicyError::TtlNotLongerThanLock { .. })
            ));
        }
        assert!(IdempotencyPolicy::new(LOCK + Duration::from_secs(1), LOCK, DAY).is_ok());
    }

    #[test]
    fn zero_durations_are_refused() {
        assert_eq!(
            IdempotencyPolicy::new(Duration::ZERO, LOCK, DAY),
            Err(PolicyError::ZeroTtl)
        );
        assert_eq!(
            IdempotencyPolicy::new(DAY, Duration::ZERO, DAY),
            Err(PolicyError::ZeroLockTimeout)
        );
    }
}
