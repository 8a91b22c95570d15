//! What the repositories take and return, the same for every backend.

use chrono::{DateTime, Utc};
use payments_domain::{Account, Amount, Charge, ChargeId, Currency, Refund, RefundId};
use payments_idempotency::{
    Attempt, Decision, Fingerprint, IdempotencyKey, IdempotencyRecord, RecoveryPoint, Scope,
    StoredResponse, decide,
};
use uuid::Uuid;

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This attempt owns the record and must drive it to an end.
    Owned(Claimed),
    /// The key already has a final response: send it again (and it may be cached until the
    /// record expires).
    Replay {
        response: StoredResponse,
        /// The record's generation, which a cached copy of the response is bound to.
        generation: Uuid,
        expires_at: DateTime<Utc>,
    },
    /// Another attempt holds the lock.
    InFlight { retry_after_secs: u64 },
    /// The key belongs to a different request.
    Mismatch,
}

/// What every write of an owning attempt is conditioned on: the record's generation (its
/// resource id, new whenever the key starts a new request) and the attempt number within it.
/// The attempt alone is not enough: a record that is reaped and claimed again restarts at
/// attempt 1, and a straggler of the old generation must not pass the new one's fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub attempt: Attempt,
    pub resource_id: Uuid,
}

/// What an owning attempt needs to execute or resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The attempt number, half of this attempt's [`Fence`].
    pub attempt: Attempt,
    /// The id of the resource (charge) this request creates, the same on every attempt of one
    /// generation; the other half of the fence.
    pub resource_id: Uuid,
    /// The key sent to the processor, the same on every attempt.
    pub processor_key: String,
    pub resume_from: RecoveryPoint,
    /// Known when resuming from `charged`.
    pub processor_charge_id: Option<String>,
    /// Whether an earlier attempt had the record (a takeover of an abandoned attempt).
    pub took_over: bool,
    /// Whether the claim reused the row of an earlier generation (an expired or failed
    /// record): a cached copy of that generation's response must go.
    pub replaced: bool,
}

impl Claimed {
    /// A new request under the key: it starts from the beginning.
    pub(crate) fn fresh(attempt: i32, generation: Generation) -> Self {
        Self {
            attempt: Attempt(attempt),
            resource_id: generation.resource_id,
            processor_key: generation.processor_key,
            resume_from: RecoveryPoint::Started,
            processor_charge_id: None,
            took_over: false,
            replaced: false,
        }
    }

    /// A new generation in the row of an expired or failed record.
    pub(crate) fn replacing(attempt: i32, generation: Generation) -> Self {
        Self {
            replaced: true,
            ..Self::fresh(attempt, generation)
        }
    }

    /// The fence every later write of this attempt carries.
    pub fn fence(&self) -> Fence {
        Fence {
            attempt: self.attempt,
            resource_id: self.resource_id,
        }
    }

    /// The same request, taken over from an earlier attempt: it resumes where that one left it.
    pub(crate) fn taken_over(
        taken: TakenOver,
        from: RecoveryPoint,
        processor_charge_id: Option<String>,
    ) -> Self {
        Self {
            attempt: Attempt(taken.attempt),
            resource_id: taken.resource_id,
            processor_key: taken.processor_key,
            resume_from: from,
            processor_charge_id,
            took_over: true,
            replaced: false,
        }
    }
}

/// What the takeover statement of either backend returns.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TakenOver {
    #[sqlx(rename = "attempts")]
    pub attempt: i32,
    pub resource_id: Uuid,
    pub processor_key: String,
}

/// What a claim does with a record that already exists, as [`decide`] judges it.
pub(crate) enum Verdict {
    /// Answer without executing: a replay, in flight, or a mismatch.
    Answer(Claim),
    /// Take the record over and resume it from this point.
    Resume(RecoveryPoint),
    /// Reuse the row for a new generation: the record expired, or failed for good.
    Replace,
    /// `decide` treated the record as absent (cannot happen for a record that exists).
    Absent,
}

pub(crate) fn judge(
    record: &IdempotencyRecord,
    fingerprint: &Fingerprint,
    now: DateTime<Utc>,
) -> Verdict {
    match decide(Some(record), fingerprint, now) {
        Decision::Replay(response) => Verdict::Answer(Claim::Replay {
            response,
            generation: record.generation,
            expires_at: record.expires_at,
        }),
        Decision::InFlight { retry_after_secs } => {
            Verdict::Answer(Claim::InFlight { retry_after_secs })
        }
        Decision::Mismatch => Verdict::Answer(Claim::Mismatch),
        Decision::Resume { from } => Verdict::Resume(from),
        Decision::ReplaceExpired | Decision::RetryFailed => Verdict::Replace,
        Decision::Execute => Verdict::Absent,
    }
}

/// Whether a fenced write that completes the record took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The record is completed; its retention, counted from now, ends at `expires_at`.
    Stored { expires_at: DateTime<Utc> },
    /// Another attempt or generation owns the record: nothing was written.
    Fenced,
}

impl Completion {
    /// From what a completing statement returned: the new expiry, or no row at all (fenced).
    pub(crate) fn from_expiry(expires_at: Option<DateTime<Utc>>) -> Self {
        match expires_at {
            Some(expires_at) => Self::Stored { expires_at },
            None => Self::Fenced,
        }
    }
}

/// Whether a fenced write took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The record still belonged to this attempt and was written.
    Written,
    /// Another attempt took the record over: nothing was written, and this attempt must answer
    /// from the record as it now is.
    Fenced,
}

impl Finish {
    pub(crate) fn from_rows(rows: u64) -> Self {
        if rows == 1 {
            Self::Written
        } else {
            Self::Fenced
        }
    }
}

/// A page request: newest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListCharges {
    pub limit: u32,
    pub starting_after: Option<ChargeId>,
}

/// One page of charges, newest first.
#[derive(Debug, Clone)]
pub struct ChargePage {
    pub charges: Vec<Charge>,
    pub has_more: bool,
}

/// What reserving a refund's amount on its charge came to.
#[derive(Debug, Clone)]
pub enum Reservation {
    /// The refund's pending row, made now or by an earlier attempt of the same generation, and
    /// the processor's id of the charge it refunds.
    Reserved {
        refund: Refund,
        processor_charge_id: String,
    },
    /// A final answer that depends on the charge's state, not only on the request: nothing
    /// was reserved.
    Refused(RefundRefusal),
    /// Another attempt or generation owns the record: nothing was reserved.
    Fenced,
}

/// Why a refund cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundRefusal {
    /// The tenant has no such charge.
    NoSuchCharge,
    /// No amount was asked for, and nothing of the charge is left to refund.
    NothingLeft,
    /// The amount asked for is more than is left to refund (`refundable`, possibly 0).
    TooLarge { refundable: i64 },
}

impl RefundRefusal {
    /// The amount a refund of a charge of `amount`, of which `reserved` is already claimed by
    /// other refunds, may have: `requested`, or all that is left when none was asked for.
    pub fn judge(
        amount: i64,
        reserved: i64,
        requested: Option<Amount>,
    ) -> Result<Amount, RefundRefusal> {
        let left = amount - reserved;
        match requested {
            Some(requested) if requested.minor_units() > left => {
                Err(Self::TooLarge { refundable: left })
            }
            Some(requested) => Ok(requested),
            None => Amount::new(left).map_err(|_| Self::NothingLeft),
        }
    }
}

/// A page request for a charge's refunds: newest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListRefunds {
    pub charge: ChargeId,
    pub limit: u32,
    pub starting_after: Option<RefundId>,
}

/// One page of a charge's refunds, newest first.
#[derive(Debug, Clone)]
pub struct RefundPage {
    pub refunds: Vec<Refund>,
    pub has_more: bool,
}

/// The signed sum of one account's entries in one currency (debits positive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balance {
    pub account: Account,
    pub currency: Currency,
    pub balance: i64,
}

/// A pending record whose owner went away, now owned by the completer.
#[derive(Debug, Clone)]
pub struct Abandoned {
    pub scope: Scope,
    pub key: IdempotencyKey,
    /// The completer's own attempt number: the record's attempts after the takeover.
    pub attempt: Attempt,
    pub resource_id: Uuid,
    pub processor_key: String,
    pub recovery_point: RecoveryPoint,
    pub processor_charge_id: Option<String>,
    /// The canonical JSON of the request, to finish it without the client.
    pub request_body: Option<Vec<u8>>,
}

impl Abandoned {
    /// The fence the completer's writes carry.
    pub fn fence(&self) -> Fence {
        Fence {
            attempt: self.attempt,
            resource_id: self.resource_id,
        }
    }
}

/// Unpublished events: how many, and how long the oldest has waited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub unpublished: i64,
    pub oldest_age_secs: f64,
}

impl Backlog {
    /// From the row of `outbox::backlog`: the count, and the oldest's age if any.
    pub(crate) fn from_row((unpublished, oldest_age_secs): (i64, Option<f64>)) -> Self {
        Self {
            unpublished,
            oldest_age_secs: oldest_age_secs.unwrap_or(0.0),
        }
    }
}

/// The processor key is derived from the record's resource id, fixed at claim time: it is
/// the same on every attempt and unique across tenants and expiry generations.
pub(crate) fn processor_key_for(resource_id: Uuid) -> String {
    format!("pay_{}", resource_id.simple())
}

/// A claim's new generation of a record: the id of the resource it creates (half of its
/// fence) and the key it sends to the processor.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub resource_id: Uuid,
    pub processor_key: String,
}

impl Generation {
    pub(crate) fn new() -> Self {
        Self::of(Uuid::new_v4())
    }

    /// The generation whose resource id is `resource_id`.
    pub(crate) fn of(resource_id: Uuid) -> Self {
        Self {
            resource_id,
            processor_key: processor_key_for(resource_id),
        }
    }
}

#[cfg(test)]
mod refund_tests {
    use super::*;

    fn amount(minor_units: i64) -> Amount {
        Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_refund_gets_what_it_asks_for_while_enough_is_left() {
        assert_eq!(
            RefundRefusal::judge(1000, 300, Some(amount(700))),
            Ok(amount(700))
        );
        assert_eq!(
            RefundRefusal::judge(1000, 300, Some(amount(701))),
            Err(RefundRefusal::TooLarge { refundable: 700 })
        );
    }

    #[test]
    fn a_refund_without_an_amount_takes_all_that_is_left() {
        assert_eq!(RefundRefusal::judge(1000, 300, None), Ok(amount(700)));
        assert_eq!(
            RefundRefusal::judge(1000, 1000, None),
            Err(RefundRefusal::NothingLeft)
        );
    }

    #[test]
    fn an_amount_asked_of_a_charge_with_nothing_left_is_too_large() {
        assert_eq!(
            RefundRefusal::judge(1000, 1000, Some(amount(1))),
            Err(RefundRefusal::TooLarge { refundable: 0 })
        );
    }
}
