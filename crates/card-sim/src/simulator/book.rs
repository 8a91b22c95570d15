//! What the simulator remembers about each idempotency key, and every transition between those
//! states. All of it is synchronous and runs under the simulator's one mutex, so each
//! transition is atomic: a cancel racing a charge sees the key either before the charge
//! registered it or after, never in between.

use std::collections::HashMap;

use payments_domain::{
    Amount, CancelOutcome, Money, ProcessorCharge, ProcessorChargeStatus, ProcessorError,
};
use uuid::Uuid;

use crate::TestToken;

/// How a call under a key ends once its latency has passed. The token decides which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The charge exists; repeats of the key return it.
    Charged(ProcessorCharge),
    /// A definitive decline; repeats of the key return it.
    Declined {
        decline_code: String,
        message: String,
    },
    /// Nothing was charged, and the next call under the key is a new attempt.
    FailedTransiently { reason: String },
}

/// The simulator's answer to a charge call, finer than the port's two errors so that the
/// HTTP server can tell its clients which conflict they hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChargeAnswer {
    /// The call (or the earlier one under the same key) ended in this outcome.
    Settled(Outcome),
    /// Another call under the key is still within its latency: its outcome does not exist yet.
    Processing,
    /// The key was canceled: nothing can ever be charged under it.
    KeyCanceled,
}

impl ChargeAnswer {
    /// The answer as the port states it: every conflict is `Unavailable`, because the caller
    /// learns nothing definitive about money from it.
    pub(crate) fn into_result(self) -> Result<ProcessorCharge, ProcessorError> {
        let unavailable = |reason: &str| ProcessorError::Unavailable {
            reason: reason.to_owned(),
        };
        match self {
            Self::Settled(Outcome::Charged(charge)) => Ok(charge),
            Self::Settled(Outcome::Declined {
                decline_code,
                message,
            }) => Err(ProcessorError::Declined {
                decline_code,
                message,
            }),
            Self::Settled(Outcome::FailedTransiently { reason }) => {
                Err(ProcessorError::Unavailable { reason })
            }
            Self::Processing => Err(unavailable("a call under this key is still processing")),
            Self::KeyCanceled => Err(unavailable("this key was canceled; it can never charge")),
        }
    }
}

/// One key's state.
#[derive(Debug, Clone)]
enum KeyState {
    /// A call registered the key and is waiting out its latency.
    Processing,
    /// The last call under the key ended so.
    Done(Outcome),
    /// Tombstoned by a cancel.
    Canceled,
}

/// What [`Book::begin`] decided about a charge call.
#[derive(Debug)]
pub(crate) enum Begin {
    /// The key already has an answer; nothing new happens.
    Answered(ChargeAnswer),
    /// The key is now processing; this outcome is to be recorded once the latency has passed.
    Started(Outcome),
}

/// Everything the simulator remembers.
#[derive(Debug, Default)]
pub(crate) struct Book {
    keys: HashMap<String, KeyState>,
    charges_created: u64,
}

impl Book {
    /// Registers a charge call under `key`. A new key, or one whose last call failed
    /// transiently, becomes processing and gets its outcome decided now (it is recorded only
    /// by [`Book::settle`]); any other key answers as it did before.
    pub(crate) fn begin(&mut self, key: &str, token: TestToken, money: Money) -> Begin {
        let first_attempt = match self.keys.get(key) {
            None => true,
            Some(KeyState::Done(Outcome::FailedTransiently { .. })) => false,
            Some(KeyState::Done(outcome)) => {
                return Begin::Answered(ChargeAnswer::Settled(outcome.clone()));
            }
            Some(KeyState::Processing) => return Begin::Answered(ChargeAnswer::Processing),
            Some(KeyState::Canceled) => return Begin::Answered(ChargeAnswer::KeyCanceled),
        };
        self.keys.insert(key.to_owned(), KeyState::Processing);
        Begin::Started(decide(token, money, first_attempt))
    }

    /// Records the outcome of the call that [`Book::begin`] started: from now on the charge,
    /// if there is one, exists and counts.
    pub(crate) fn settle(&mut self, key: String, outcome: Outcome) -> ChargeAnswer {
        if matches!(outcome, Outcome::Charged(_)) {
            self.charges_created += 1;
        }
        self.keys.insert(key, KeyState::Done(outcome.clone()));
        ChargeAnswer::Settled(outcome)
    }

    /// The charge under `key`, if it exists; a processing key has none yet.
    pub(crate) fn find(&self, key: &str) -> Option<ProcessorCharge> {
        match self.keys.get(key) {
            Some(KeyState::Done(Outcome::Charged(charge))) => Some(charge.clone()),
            _ => None,
        }
    }

    /// Settles `key` for good: its charge, or "still processing", or a tombstone for every
    /// other case (unknown, declined, failed, already canceled).
    pub(crate) fn cancel(&mut self, key: &str) -> CancelOutcome<ProcessorCharge> {
        match self.keys.get(key) {
            Some(KeyState::Done(Outcome::Charged(charge))) => {
                CancelOutcome::Exists(charge.clone())
            }
            Some(KeyState::Processing) => CancelOutcome::StillProcessing,
            _ => {
                self.keys.insert(key.to_owned(), KeyState::Canceled);
                CancelOutcome::Canceled
            }
        }
    }

    /// The number of distinct charges that came into existence.
    pub(crate) fn charges_created(&self) -> u64 {
        self.charges_created
    }
}

/// The token rules: how a call under a key that has no definitive answer yet will end.
fn decide(token: TestToken, money: Money, first_attempt: bool) -> Outcome {
    let declined = |decline_code: &str, message: &str| Outcome::Declined {
        decline_code: decline_code.to_owned(),
        message: message.to_owned(),
    };
    match token {
        TestToken::FailsTransiently => Outcome::FailedTransiently {
            reason: "simulated processing error".into(),
        },
        TestToken::FailsOnceThenSucceeds if first_attempt => Outcome::FailedTransiently {
            reason: "simulated processing error (once)".into(),
        },
        TestToken::Declined => declined("generic_decline", "The card was declined."),
        TestToken::Unknown => declined("invalid_token", "The card token is not recognised."),
        TestToken::ReportsWrongAmount => charged(off_by_one_unit(money)),
        TestToken::Succeeds | TestToken::SucceedsSlowly | TestToken::FailsOnceThenSucceeds => {
            charged(money)
        }
    }
}

fn charged(money: Money) -> Outcome {
    Outcome::Charged(ProcessorCharge {
        id: format!("sim_{}", Uuid::new_v4().simple()),
        money,
        status: ProcessorChargeStatus::Succeeded,
    })
}

/// One minor unit more than `money`, or one less at [`Amount::MAX`], where there is no more.
fn off_by_one_unit(money: Money) -> Money {
    let units = money.amount.minor_units();
    let wrong = Amount::new(units + 1)
        .or_else(|_| Amount::new(units - 1))
        .unwrap_or(money.amount);
    Money::new(wrong, money.currency)
}
