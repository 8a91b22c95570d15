//! Where the simulator reads the time: when what it made came into existence (the report's
//! `created_at`), and when a key's window has passed. Injected, so that a test can move a
//! week forward without waiting for it.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// The time source of one simulator.
#[derive(Clone)]
pub(crate) struct Clock(Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>);

impl Clock {
    /// The system's clock: what a running simulator uses.
    pub(crate) fn system() -> Self {
        Self(Arc::new(Utc::now))
    }

    /// A clock that reads `now`, for tests that move time by hand.
    #[cfg(test)]
    pub(crate) fn from_fn(now: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        (self.0)()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Clock")
    }
}
