//! What the repositories take and return, the same for every backend.

use chrono::{DateTime, NaiveDate, Utc};
use payments_domain::{
    Account, Amount, Charge, ChargeId, Currency, EventId, EventType, ExceptionId, HeldRecord,
    ItemResult, Money, Payout, PayoutId, Refund, RefundId, ResolutionAction, ResolutionNote,
    SettlementKind, TenantId,
};
use payments_idempotency::{IdempotencyKey, Scope, StoredResponse};

pub(crate) use payments_idempotency::engine::Owner;

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

/// A page request of a tenant's events: oldest first, after an optional cursor, of one type
/// or of all.
#[derive(Debug, Clone, Copy)]
pub struct ListEvents {
    pub limit: u32,
    pub starting_after: Option<EventId>,
    pub event_type: Option<EventType>,
}

/// An event as the outbox keeps it: its payload is what the stream entry carries.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub id: EventId,
    pub event_type: EventType,
    pub payload: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// One page of events, oldest first.
#[derive(Debug, Clone)]
pub struct EventPage {
    pub events: Vec<StoredEvent>,
    pub has_more: bool,
}

pub use payments_idempotency_sql::PendingEffect;

/// Where an exception stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExceptionStatus {
    Open,
    Resolved,
}

impl ExceptionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Resolved => "resolved",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Open, Self::Resolved]
            .into_iter()
            .find(|status| status.as_str() == name)
    }
}

/// A page request of the exceptions of one status: oldest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListExceptions {
    pub status: ExceptionStatus,
    pub limit: u32,
    pub starting_after: Option<ExceptionId>,
}

/// An exception as it is kept: what each side held of it when the run found it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconciliationException {
    pub id: ExceptionId,
    pub report_date: NaiveDate,
    /// One of the exception results ([`ItemResult::is_exception`]).
    pub kind: ItemResult,
    pub status: ExceptionStatus,
    pub created_at: DateTime<Utc>,
    pub effect: SettlementKind,
    pub processor_id: String,
    pub tenant: Option<TenantId>,
    /// The processor's line, if the processor reported it.
    pub processor: Option<ProcessorSide>,
    /// The books' side, if the books hold it.
    pub books: Option<BooksSide>,
    /// The pending record a mismatch holds.
    pub record: Option<HeldRecord>,
    /// The service's id of it (`ch_…`, `re_…`, `po_…`): the books', or the one the processor's
    /// metadata names.
    pub resource_id: Option<String>,
    /// How an operator resolved it, once resolved.
    pub resolution: Option<Resolution>,
}

/// How an operator resolved an exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub action: ResolutionAction,
    /// The operator key's name.
    pub operator: String,
    pub note: String,
    pub resolved_at: DateTime<Utc>,
    /// `record`: the service's id of what it posted.
    pub recorded_id: Option<String>,
    /// `void`: the processor's id of what it gave back.
    pub void_processor_id: Option<String>,
}

/// What holding an exception for a resolution found.
#[derive(Debug, Clone)]
pub enum ExceptionHold {
    /// The exception is open and now held by the resolution's generation (or was already).
    Held(Box<ReconciliationException>),
    /// It was resolved already: nothing more can change it.
    Resolved,
    /// Another resolution, under another key, is at work on it.
    HeldByAnother,
    /// No exception has that id.
    Missing,
}

/// A resolution to write in the transaction that completes its record.
#[derive(Debug, Clone, Copy)]
pub struct NewResolution<'a> {
    pub exception: ExceptionId,
    pub action: ResolutionAction,
    pub operator: &'a str,
    pub note: &'a ResolutionNote,
    /// The service's clock, as for the exceptions, so that a list of them pages on one form.
    pub resolved_at: DateTime<Utc>,
    pub posts: Posting<'a>,
}

/// What a resolution writes into the books besides itself.
#[derive(Debug, Clone, Copy)]
pub enum Posting<'a> {
    /// `accept`: nothing.
    Nothing,
    /// `record`: the charge the processor made, with its ledger transaction and its event,
    /// written as a charge's finish writes them.
    Charge(&'a Charge),
    /// `void`: what the processor gave back; and the pending record the voided charge was made
    /// for, if any, which ends with `response`.
    Void {
        tenant: Option<&'a TenantId>,
        processor_id: &'a str,
        money: Money,
        held: Option<HeldEnd<'a>>,
    },
}

/// A pending record that no attempt will ever finish, and the final answer it ends with.
#[derive(Debug, Clone, Copy)]
pub struct HeldEnd<'a> {
    pub scope: &'a Scope,
    pub key: &'a IdempotencyKey,
    pub response: &'a StoredResponse,
}

/// What the processor's line of an exception said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorSide {
    pub processor_key: String,
    pub money: Money,
}

/// What the books held of an exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BooksSide {
    /// The service's id of it (`ch_…`, `re_…`, `po_…`).
    pub resource_id: String,
    pub money: Money,
}

/// One page of exceptions, oldest first.
#[derive(Debug, Clone)]
pub struct ExceptionPage {
    pub exceptions: Vec<ReconciliationException>,
    pub has_more: bool,
}

/// What saving a reconciliation run changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedRun {
    /// Exceptions the run added; a second run over the same day adds none it found before.
    pub exceptions_added: u64,
    /// Exceptions still open, over every day.
    pub open_exceptions: i64,
}

/// Which outbox rows the reaper deletes once they are older than the retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPruning {
    /// A stream relays the rows: only those it has taken (published) go, by the time they
    /// were published; an unpublished row stays however old.
    Published,
    /// No stream: the events API is the rows' only reader, and they go by age alone.
    ByAge,
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
    /// The refund would take the tenant's balance below what its payouts hold: only
    /// `available` is left in the charge's currency.
    InsufficientBalance { available: i64 },
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

/// What reserving a payout's amount on the tenant's balance came to.
#[derive(Debug, Clone)]
pub enum PayoutReservation {
    /// The payout's pending row, made now or by an earlier attempt of the same generation.
    Reserved(Payout),
    /// The balance does not cover the payout: only `available` is left in its currency.
    /// Nothing was reserved.
    InsufficientBalance { available: i64 },
}

/// A page request for the tenant's payouts: newest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListPayouts {
    pub limit: u32,
    pub starting_after: Option<PayoutId>,
}

/// One page of payouts, newest first.
#[derive(Debug, Clone)]
pub struct PayoutPage {
    pub payouts: Vec<Payout>,
    pub has_more: bool,
}

/// A tenant's money in one currency: what it may pay out or refund now, and what its payouts
/// in flight hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Funds {
    pub currency: Currency,
    /// The balance of the ledger's `customer_payments`, less what refunds and payouts in
    /// flight hold. Never below zero.
    pub available: i64,
    /// What payouts in flight hold.
    pub pending: i64,
}

/// How durable a commit the database acknowledges is, as it is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// A commit is acknowledged once a synchronous standby has it too: a failover to that
    /// standby loses nothing the service was told is committed.
    Standby,
    /// A commit is acknowledged once this node has it: a failover to a standby that was behind
    /// can lose commits the service already answered for (a charge made at the processor whose
    /// record is gone).
    Local,
}

impl Durability {
    /// The name `/readyz` shows.
    pub fn name(self) -> &'static str {
        match self {
            Self::Standby => "standby",
            Self::Local => "local",
        }
    }

    /// From PostgreSQL's settings: a commit waits for a standby when standbys are named as
    /// synchronous and `synchronous_commit` waits for them (`on`, `remote_write`,
    /// `remote_apply`; `local` and `off` do not).
    pub fn of_postgres(synchronous_commit: &str, synchronous_standby_names: &str) -> Self {
        let waits = matches!(synchronous_commit, "on" | "remote_write" | "remote_apply");
        if waits && !synchronous_standby_names.trim().is_empty() {
            Self::Standby
        } else {
            Self::Local
        }
    }
}

/// The signed sum of one account's entries in one currency (debits positive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balance {
    pub account: Account,
    pub currency: Currency,
    pub balance: i64,
}

/// Unpublished events: how many, and how long the oldest has waited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub unpublished: i64,
    pub oldest_age_secs: f64,
}

impl Backlog {
    /// From the row of `OUTBOX_BACKLOG`: the count, and the oldest's age if any.
    pub(crate) fn from_row((unpublished, oldest_age_secs): (i64, Option<f64>)) -> Self {
        Self {
            unpublished,
            oldest_age_secs: oldest_age_secs.unwrap_or(0.0),
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

#[cfg(test)]
mod durability_tests {
    use super::*;

    #[test]
    fn a_commit_waits_for_a_standby_only_when_one_is_named_and_synchronous_commit_waits() {
        let standby = Durability::Standby;
        let local = Durability::Local;
        let cases = [
            ("on", "", local),
            ("on", "ANY 1 (node2, node3)", standby),
            ("remote_apply", "node2", standby),
            ("remote_write", "*", standby),
            ("local", "node2", local),
            ("off", "node2", local),
            ("on", "  ", local),
        ];
        for (commit, names, durability) in cases {
            assert_eq!(
                Durability::of_postgres(commit, names),
                durability,
                "{commit} {names:?}"
            );
        }
    }
}
