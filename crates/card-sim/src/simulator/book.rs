//! What the simulator remembers about each idempotency key, and every transition between those
//! states. One book per kind of call (charges and authorisations in one, refunds, captures,
//! voids, payouts), generic over what a key settles to, so that all keep exactly the same
//! protocol. All of it is synchronous and runs
//! under the simulator's one mutex, so each transition is atomic: a cancel racing a call sees
//! the key either before the call registered it or after, never in between.
//!
//! Like a real processor, a book forgets a key once its key window has passed since the key
//! settled (or was canceled), with what was made under it: memory is bounded by the traffic
//! within the window, not by all the traffic ever. The sweep is amortised: every settle and
//! cancel queues the key with its time, and [`Book::forget_settled_before`] pops the front of
//! that queue, so no background task is needed.

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, Utc};
use payments_domain::{CancelOutcome, ProcessorError, ProcessorMetadata};

/// How a call under a key ends once its latency has passed. The rules decide which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome<T> {
    /// What the call made exists; repeats of the key return it.
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
    /// A definitive decline with its code and message.
    pub(crate) fn declined(decline_code: &str, message: impl Into<String>) -> Self {
        Self::Declined {
            decline_code: decline_code.to_owned(),
            message: message.into(),
        }
    }

    /// The same outcome, with what a success made changed by `made`.
    pub(crate) fn map<U>(self, made: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Self::Succeeded(value) => Outcome::Succeeded(made(value)),
            Self::Declined {
                decline_code,
                message,
            } => Outcome::Declined {
                decline_code,
                message,
            },
            Self::FailedTransiently { reason } => Outcome::FailedTransiently { reason },
        }
    }

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

/// When a key settled or was canceled. `at` dates it, for the key window and the report;
/// `seq`, unique across the simulator's books and growing with each stamp, tells a key's latest
/// settle from an earlier one and orders what the books made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) at: DateTime<Utc>,
    pub(crate) seq: u64,
}

/// Something a call made, as the simulator keeps it and shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Made<T> {
    /// The charge, the refund, the capture, the void or the payout, as the port reports it.
    pub(crate) value: T,
    /// As the caller sent it; `None` when it sent none.
    pub(crate) metadata: Option<ProcessorMetadata>,
    /// When its latency had passed and it came into existence.
    pub(crate) created_at: DateTime<Utc>,
}

/// One key's state. A settled or canceled key carries the `seq` of its stamp, so that a queued
/// expiry of an earlier settle of the same key is recognised as stale.
#[derive(Debug, Clone)]
enum KeyState<T> {
    /// A call registered the key and is waiting out its latency.
    Processing,
    /// The last call under the key ended so.
    Done { outcome: Outcome<Made<T>>, seq: u64 },
    /// Tombstoned by a cancel.
    Canceled { seq: u64 },
}

impl<T> KeyState<T> {
    fn seq(&self) -> Option<u64> {
        match self {
            Self::Processing => None,
            Self::Done { seq, .. } | Self::Canceled { seq } => Some(*seq),
        }
    }
}

/// What [`Book::begin`] decided about a call.
#[derive(Debug)]
pub(crate) enum Begin<T> {
    /// The key already has an answer; nothing new happens.
    Answered(Answer<Made<T>>),
    /// The key is now processing; this outcome is to be recorded once the latency has passed.
    Started(Outcome<T>),
}

/// A key to forget once the key window has passed since `at`, unless it settled again since
/// (the key's `seq` is then another).
#[derive(Debug)]
struct Expiry {
    at: DateTime<Utc>,
    seq: u64,
    key: String,
}

/// Everything the simulator remembers about the keys of one kind of call.
#[derive(Debug)]
pub(crate) struct Book<T> {
    keys: HashMap<String, KeyState<T>>,
    /// Every settle and cancel, oldest first: the order in which keys are forgotten.
    expiries: VecDeque<Expiry>,
    created: u64,
}

impl<T> Default for Book<T> {
    fn default() -> Self {
        Self {
            keys: HashMap::new(),
            expiries: VecDeque::new(),
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
            Some(KeyState::Done {
                outcome: Outcome::FailedTransiently { .. },
                ..
            }) => false,
            Some(KeyState::Done { outcome, .. }) => {
                return Begin::Answered(Answer::Settled(outcome.clone()));
            }
            Some(KeyState::Processing) => return Begin::Answered(Answer::Processing),
            Some(KeyState::Canceled { .. }) => return Begin::Answered(Answer::KeyCanceled),
        };
        self.keys.insert(key.to_owned(), KeyState::Processing);
        Begin::Started(decide(first_attempt))
    }

    /// Records the outcome of the call that [`Book::begin`] started, at `stamp`: from now on
    /// what it made, if anything, exists and counts, with the caller's `metadata`.
    pub(crate) fn settle(
        &mut self,
        key: String,
        outcome: Outcome<T>,
        metadata: Option<ProcessorMetadata>,
        stamp: Stamp,
    ) -> Answer<Made<T>> {
        let outcome = outcome.map(|value| Made {
            value,
            metadata,
            created_at: stamp.at,
        });
        if matches!(outcome, Outcome::Succeeded(_)) {
            self.created += 1;
        }
        let seq = stamp.seq;
        self.remember(
            key,
            KeyState::Done {
                outcome: outcome.clone(),
                seq,
            },
            stamp,
        );
        Answer::Settled(outcome)
    }

    /// What was made under `key`, if it exists; a processing key has nothing yet.
    pub(crate) fn find(&self, key: &str) -> Option<Made<T>> {
        match self.keys.get(key) {
            Some(KeyState::Done {
                outcome: Outcome::Succeeded(made),
                ..
            }) => Some(made.clone()),
            _ => None,
        }
    }

    /// Settles `key` for good: what was made under it, or "still processing", or a tombstone
    /// dated `stamp` for every other case (unknown, declined, failed, already canceled).
    pub(crate) fn cancel(&mut self, key: &str, stamp: Stamp) -> CancelOutcome<Made<T>> {
        match self.keys.get(key) {
            Some(KeyState::Done {
                outcome: Outcome::Succeeded(made),
                ..
            }) => CancelOutcome::Exists(made.clone()),
            Some(KeyState::Processing) => CancelOutcome::StillProcessing,
            _ => {
                let seq = stamp.seq;
                self.remember(key.to_owned(), KeyState::Canceled { seq }, stamp);
                CancelOutcome::Canceled
            }
        }
    }

    /// The number of distinct keys under which something came into existence, forgotten or
    /// not.
    pub(crate) fn created(&self) -> u64 {
        self.created
    }

    /// Every key that settled (or was canceled) last before `cutoff` is forgotten, with what
    /// was made under it, which is returned so that what refers to it can go too. Pops only
    /// the front of the queue: the cost is that of what is forgotten. A system clock that
    /// steps back leaves the queue out of order for a while; that delays forgetting what is
    /// queued behind, and never forgets anything early.
    pub(crate) fn forget_settled_before(&mut self, cutoff: DateTime<Utc>) -> Vec<T> {
        let mut forgotten = Vec::new();
        while self.expiries.front().is_some_and(|next| next.at < cutoff) {
            let Some(expiry) = self.expiries.pop_front() else {
                break;
            };
            // A key that settled again since (a retry after a transient failure, a cancel of a
            // declined key) or is processing again lives by its latest stamp, not this one.
            if self.keys.get(&expiry.key).and_then(KeyState::seq) != Some(expiry.seq) {
                continue;
            }
            if let Some(KeyState::Done {
                outcome: Outcome::Succeeded(made),
                ..
            }) = self.keys.remove(&expiry.key)
            {
                forgotten.push(made.value);
            }
        }
        forgotten
    }

    /// Everything made under the keys still remembered, with its key and the `seq` of its
    /// settle, in no particular order.
    pub(crate) fn made(&self) -> impl Iterator<Item = (&str, u64, &Made<T>)> {
        self.keys.iter().filter_map(|(key, state)| match state {
            KeyState::Done {
                outcome: Outcome::Succeeded(made),
                seq,
            } => Some((key.as_str(), *seq, made)),
            _ => None,
        })
    }

    /// The number of keys remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The number of queued expiries, stale ones included.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.expiries.len()
    }

    /// Keeps `key` in `state`, to be forgotten once the window has passed since `stamp`.
    fn remember(&mut self, key: String, state: KeyState<T>, stamp: Stamp) {
        self.expiries.push_back(Expiry {
            at: stamp.at,
            seq: stamp.seq,
            key: key.clone(),
        });
        self.keys.insert(key, state);
    }
}
