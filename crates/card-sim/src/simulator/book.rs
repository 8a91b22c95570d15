//! What the simulator remembers about each idempotency key, and every transition between those
//! states. One book per kind of call (charges, refunds), generic over what a key settles to, so
//! that both keep exactly the same protocol. All of it is synchronous and runs under the
//! simulator's one mutex, so each transition is atomic: a cancel racing a call sees the key
//! either before the call registered it or after, never in between.

use std::collections::HashMap;

use payments_domain::{CancelOutcome, ProcessorError};

/// How a call under a key ends once its latency has passed. The rules decide which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome<T> {
    /// The charge or refund exists; repeats of the key return it.
    Succeeded(T),
    /// A definitive decline; repeats of the key return it.
    Declined {
        decline_code: String,
        message: String,
    },
    /// Nothing was made, and the next call under the key is a new attempt.
    FailedTransiently { reason: String },
}

/// The simulator's answer to a call, finer than the port's two errors so that the HTTP server
/// can tell its clients which conflict they hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer<T> {
    /// The call (or the earlier one under the same key) ended in this outcome.
    Settled(Outcome<T>),
    /// Another call under the key is still within its latency: its outcome does not exist yet.
    Processing,
    /// The key was canceled: nothing can ever be made under it.
    KeyCanceled,
}

impl<T> Outcome<T> {
    /// The outcome as the port states it: what was made, a decline, or (for a transient
    /// failure) `Unavailable`, since nothing definitive happened.
    pub(crate) fn into_result(self) -> Result<T, ProcessorError> {
        match self {
            Self::Succeeded(made) => Ok(made),
            Self::Declined {
                decline_code,
                message,
            } => Err(ProcessorError::Declined {
                decline_code,
                message,
            }),
            Self::FailedTransiently { reason } => Err(ProcessorError::Unavailable { reason }),
        }
    }
}

impl<T> Answer<T> {
    /// The answer as the port states it: every conflict is `Unavailable`, because the caller
    /// learns nothing definitive about money from it.
    pub(crate) fn into_result(self) -> Result<T, ProcessorError> {
        let unavailable = |reason: &str| ProcessorError::Unavailable {
            reason: reason.to_owned(),
        };
        match self {
            Self::Settled(outcome) => outcome.into_result(),
            Self::Processing => Err(unavailable("a call under this key is still processing")),
            Self::KeyCanceled => Err(unavailable(
                "this key was canceled; nothing can ever be made under it",
            )),
        }
    }
}

/// One key's state.
#[derive(Debug, Clone)]
enum KeyState<T> {
    /// A call registered the key and is waiting out its latency.
    Processing,
    /// The last call under the key ended so.
    Done(Outcome<T>),
    /// Tombstoned by a cancel.
    Canceled,
}

/// What [`Book::begin`] decided about a call.
#[derive(Debug)]
pub(crate) enum Begin<T> {
    /// The key already has an answer; nothing new happens.
    Answered(Answer<T>),
    /// The key is now processing; this outcome is to be recorded once the latency has passed.
    Started(Outcome<T>),
}

/// Everything the simulator remembers about the keys of one kind of call.
#[derive(Debug)]
pub(crate) struct Book<T> {
    keys: HashMap<String, KeyState<T>>,
    created: u64,
}

impl<T> Default for Book<T> {
    fn default() -> Self {
        Self {
            keys: HashMap::new(),
            created: 0,
        }
    }
}

impl<T: Clone> Book<T> {
    /// Registers a call under `key`. A new key, or one whose last call failed transiently,
    /// becomes processing and gets its outcome from `decide` now (told whether this is the
    /// key's first attempt); the outcome is recorded only by [`Book::settle`]. Any other key
    /// answers as it did before, and `decide` is not called.
    pub(crate) fn begin(&mut self, key: &str, decide: impl FnOnce(bool) -> Outcome<T>) -> Begin<T> {
        let first_attempt = match self.keys.get(key) {
            None => true,
            Some(KeyState::Done(Outcome::FailedTransiently { .. })) => false,
            Some(KeyState::Done(outcome)) => {
                return Begin::Answered(Answer::Settled(outcome.clone()));
            }
            Some(KeyState::Processing) => return Begin::Answered(Answer::Processing),
            Some(KeyState::Canceled) => return Begin::Answered(Answer::KeyCanceled),
        };
        self.keys.insert(key.to_owned(), KeyState::Processing);
        Begin::Started(decide(first_attempt))
    }

    /// Records the outcome of the call that [`Book::begin`] started: from now on what it made,
    /// if anything, exists and counts.
    pub(crate) fn settle(&mut self, key: String, outcome: Outcome<T>) -> Answer<T> {
        if matches!(outcome, Outcome::Succeeded(_)) {
            self.created += 1;
        }
        self.keys.insert(key, KeyState::Done(outcome.clone()));
        Answer::Settled(outcome)
    }

    /// What was made under `key`, if it exists; a processing key has nothing yet.
    pub(crate) fn find(&self, key: &str) -> Option<T> {
        match self.keys.get(key) {
            Some(KeyState::Done(Outcome::Succeeded(made))) => Some(made.clone()),
            _ => None,
        }
    }

    /// Settles `key` for good: what was made under it, or "still processing", or a tombstone
    /// for every other case (unknown, declined, failed, already canceled).
    pub(crate) fn cancel(&mut self, key: &str) -> CancelOutcome<T> {
        match self.keys.get(key) {
            Some(KeyState::Done(Outcome::Succeeded(made))) => CancelOutcome::Exists(made.clone()),
            Some(KeyState::Processing) => CancelOutcome::StillProcessing,
            _ => {
                self.keys.insert(key.to_owned(), KeyState::Canceled);
                CancelOutcome::Canceled
            }
        }
    }

    /// The number of distinct keys under which something came into existence.
    pub(crate) fn created(&self) -> u64 {
        self.created
    }
}
