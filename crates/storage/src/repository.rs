//! The repositories the service works through, as traits: one implementation per backend
//! (PostgreSQL for deployments, SQLite for the embedded mode), the same guarantees from both.
//!
//! Every implementation must keep these promises, and the storage and black-box suites check
//! them against each backend:
//! - a claim is atomic: of any number of concurrent claims of one key, exactly one owns it;
//! - every write after the claim names its record with one [`Owner`] and is fenced on the
//!   record's generation and attempt number (its `fence`): it writes nothing once another
//!   attempt or generation owns the record;
//! - the engine ends a record in a [`Transaction`] begun over it, which locks it: an
//!   operation's rows (a charge or a refund, its balanced ledger transaction, its outbox event)
//!   are written in it with the completed record, or nothing is, and every completion counts
//!   the record's retention from itself (`expires_at = now + ttl`);
//! - refunds of one charge reserve their amounts one after the other and never together
//!   exceed it; payouts and refunds of one tenant reserve one after the other and never take
//!   its balance below zero; a reservation is released only with the record that ends its
//!   refund or payout without one;
//! - a record that holds an effect id is never failed; completed, it has the rows of its
//!   effect (they are written in the transaction that completes it), so the reaper judges it
//!   by the record alone;
//! - lock expiry is judged by the database's clock, never by an instance's.

use std::collections::HashSet;
use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use payments_domain::{
    BooksEntry, Charge, ChargeId, EventId, ExceptionId, Payout, PayoutId, PayoutRequest,
    ReconciledItem, Refund, RefundId, RefundRequest, SettlementKind, TenantId,
};
use payments_idempotency::IdempotencyPolicy;
#[cfg(feature = "bench")]
use payments_idempotency::{Fingerprint, IdempotencyKey, Scope};

use crate::StoreError;
use crate::model::{
    Backlog, Balance, ChargePage, Durability, EventPage, EventPruning, ExceptionHold,
    ExceptionPage, Funds, ListCharges, ListEvents, ListExceptions, ListPayouts, ListRefunds,
    NewResolution, Owner, PayoutPage, PayoutReservation, ReconciliationException, RefundPage,
    Reservation, SavedRun, StoredEvent,
};
use crate::relay::{EventSink, RelayError};
use crate::{Backend, Transaction};
use payments_idempotency_sql::SqlRecords;

/// Charges and the ledger: the charge operation's finish, and the reads within one tenant.
#[async_trait]
pub trait ChargeRepository: Send + Sync {
    /// Writes the charge, its ledger transaction and its `payment.completed` outbox event in
    /// `transaction`, begun over the charge's record.
    async fn insert_charge(
        &self,
        transaction: &mut Transaction,
        charge: &Charge,
    ) -> Result<(), StoreError>;

    /// The tenant's charge with this id; another tenant's charge is simply not found.
    async fn get_charge(
        &self,
        tenant: &TenantId,
        id: ChargeId,
    ) -> Result<Option<Charge>, StoreError>;

    /// A page of the tenant's charges, or `None` when the cursor is not one of its charges.
    async fn list_charges(
        &self,
        tenant: &TenantId,
        page: ListCharges,
    ) -> Result<Option<ChargePage>, StoreError> {
        let cursor = match page.starting_after {
            Some(id) => match self.get_charge(tenant, id).await? {
                Some(charge) => Some(charge),
                None => return Ok(None),
            },
            None => None,
        };
        self.charges_after(tenant, cursor.as_ref(), page.limit)
            .await
            .map(Some)
    }

    /// Up to `limit` of the tenant's charges, newest first, older than `cursor` (keyset
    /// pagination on `(created_at, id)`, which stays fast however deep a client pages).
    async fn charges_after(
        &self,
        tenant: &TenantId,
        cursor: Option<&Charge>,
        limit: u32,
    ) -> Result<ChargePage, StoreError>;

    /// The tenant's balances, ordered by currency then account.
    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError>;
}

/// Refunds: the reservation of a refund's amount on its charge, the fenced writes that end a
/// refund, and the reads. A refund's row has the id of its record's generation, so every
/// attempt of one generation finds the same reservation.
#[async_trait]
pub trait RefundRepository: Send + Sync {
    /// Reserves the refund's amount on its charge for the generation `owner` holds, in
    /// `transaction`, begun over its record: the charge's row is locked, so refunds of one
    /// charge under different keys reserve one after the other and never exceed it together.
    /// Idempotent per generation: a reservation the generation already made is returned as it
    /// is.
    async fn reserve_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &RefundRequest,
        created_at: DateTime<Utc>,
    ) -> Result<Reservation, StoreError>;

    /// Writes the succeeded refund, the charge's refunded amount, the reversing ledger
    /// transaction and its `payment.refunded` outbox event in `transaction`, begun over the
    /// refund's record.
    async fn finish_refund(
        &self,
        transaction: &mut Transaction,
        refund: &Refund,
    ) -> Result<(), StoreError>;

    /// Releases whatever the generation `owner` holds reserved, in `transaction`, begun over
    /// its record, which ends without a refund.
    async fn release_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError>;

    /// The tenant's refund with this id; another tenant's refund is simply not found.
    async fn get_refund(
        &self,
        tenant: &TenantId,
        id: RefundId,
    ) -> Result<Option<Refund>, StoreError>;

    /// A page of the refunds of one of the tenant's charges, newest first, or `None` when the
    /// cursor is not one of that charge's refunds.
    async fn list_refunds(
        &self,
        tenant: &TenantId,
        page: ListRefunds,
    ) -> Result<Option<RefundPage>, StoreError>;
}

/// Payouts: the reservation of a payout's amount on the tenant's balance, the fenced writes
/// that end a payout, and the reads. A payout's row has the id of its record's generation, so
/// every attempt of one generation finds the same reservation.
#[async_trait]
pub trait PayoutRepository: Send + Sync {
    /// Reserves the payout's amount on the tenant's balance for the generation `owner` holds,
    /// in `transaction`, begun over its record: the balance's row is locked, so payouts and
    /// refunds of one tenant under different keys reserve one after the other and never take
    /// it below zero. Idempotent per generation: a reservation the generation already made is
    /// returned as it is.
    async fn reserve_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &PayoutRequest,
        created_at: DateTime<Utc>,
    ) -> Result<PayoutReservation, StoreError>;

    /// Writes the paid payout, its ledger transaction and its `payout.paid` outbox event in
    /// `transaction`, begun over the payout's record.
    async fn finish_payout(
        &self,
        transaction: &mut Transaction,
        payout: &Payout,
    ) -> Result<(), StoreError>;

    /// Releases whatever the generation `owner` holds reserved, in `transaction`, begun over
    /// its record, which ends without a payout.
    async fn release_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError>;

    /// The tenant's payout with this id; another tenant's payout is simply not found.
    async fn get_payout(
        &self,
        tenant: &TenantId,
        id: PayoutId,
    ) -> Result<Option<Payout>, StoreError>;

    /// A page of the tenant's payouts, newest first, or `None` when the cursor is not one of
    /// its payouts.
    async fn list_payouts(
        &self,
        tenant: &TenantId,
        page: ListPayouts,
    ) -> Result<Option<PayoutPage>, StoreError>;

    /// The tenant's funds per currency, ordered by currency: what is available, and what its
    /// payouts in flight hold.
    async fn funds(&self, tenant: &TenantId) -> Result<Vec<Funds>, StoreError>;
}

/// What the outbox relay needs, each backend its own way. (The completer's takeover and the
/// reaper are the record store's: [`Store::records`].)
#[async_trait]
pub trait WorkerRepository: Send + Sync {
    /// Publishes up to `batch` unpublished events and marks them published; returns how many.
    /// Rows are marked only after the stream accepted them: at least once, never lost.
    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError>;
}

/// The events feed (`GET /events`), from the outbox (`events.rs`), always within one tenant.
#[async_trait]
pub trait EventRepository: Send + Sync {
    /// The tenant's event with this id; another tenant's is simply not found.
    async fn get_event(
        &self,
        tenant: &TenantId,
        id: EventId,
    ) -> Result<Option<StoredEvent>, StoreError>;

    /// A page of the tenant's events, oldest first, or `None` when the cursor is not one of
    /// its events. What a reader sees is always a prefix of the feed: an event that commits
    /// later is never placed before one already shown.
    async fn list_events(
        &self,
        tenant: &TenantId,
        page: ListEvents,
    ) -> Result<Option<EventPage>, StoreError>;
}

/// Reconciliation against the processor's settlement report (`reconciling.rs`). It reads the
/// books of every tenant: an operator's job, never reachable with a tenant's key.
#[async_trait]
pub trait ReconciliationRepository: Send + Sync {
    /// Every charge, succeeded refund and paid payout the books hold with a `created_at` in
    /// `[from, to)`.
    async fn books_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<BooksEntry>, StoreError>;

    /// What the books hold under the processor's id `processor_id` of `kind`, whenever it was
    /// made.
    async fn books_entry(
        &self,
        kind: SettlementKind,
        processor_id: &str,
    ) -> Result<Option<BooksEntry>, StoreError>;

    /// Which of `items` (a kind and a processor id each) an operator has resolved the kept
    /// exception of, in as few reads as the database's limit on bound values allows.
    async fn resolved_among(
        &self,
        items: &[(SettlementKind, &str)],
    ) -> Result<HashSet<(SettlementKind, String)>, StoreError>;

    /// Keeps the run of `date`: its counts, replacing an earlier run's, and its exceptions,
    /// adding none the day already holds.
    async fn save_reconciliation(
        &self,
        date: NaiveDate,
        items: &[ReconciledItem],
    ) -> Result<SavedRun, StoreError>;

    /// The exception with this id, whatever its status.
    async fn get_exception(
        &self,
        id: ExceptionId,
    ) -> Result<Option<ReconciliationException>, StoreError>;

    /// A page of the exceptions of one status, oldest first, or `None` when the cursor is not
    /// an exception of that status.
    async fn list_exceptions(
        &self,
        page: ListExceptions,
    ) -> Result<Option<ExceptionPage>, StoreError>;
}

/// Resolving reconciliation exceptions (`resolving.rs`): the resolution operation's hold on
/// its exception, its finish, and its end without an effect. Like reconciliation, an
/// operator's job across tenants.
#[async_trait]
pub trait ResolutionRepository: Send + Sync {
    /// Holds the exception `id` for the generation `owner` holds, in `transaction`, begun over
    /// its record, so that resolutions under other keys find it held and change nothing.
    /// Idempotent per generation.
    async fn hold_exception(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        id: ExceptionId,
    ) -> Result<ExceptionHold, StoreError>;

    /// Writes the resolution, marks its exception resolved and writes what it posts, in
    /// `transaction`, begun over the resolution's record (`owner`).
    async fn finish_resolution(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        resolution: &NewResolution<'_>,
    ) -> Result<(), StoreError>;

    /// Lets go of the exception the generation `owner` held, in `transaction`, begun over its
    /// record, which ends without a resolution.
    async fn release_exception(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError>;
}

/// The outbox's upkeep (`store.rs`).
#[async_trait]
pub trait OutboxRepository: Send + Sync {
    /// The size and age of the unpublished backlog.
    async fn outbox_backlog(&self) -> Result<Backlog, StoreError>;

    /// Deletes up to `batch` outbox rows older than `retention` (by the database's clock), the
    /// oldest first, and returns how many. With [`EventPruning::Published`] an unpublished row
    /// is never deleted, however old: its event has yet to reach the stream.
    async fn prune_events(
        &self,
        pruning: EventPruning,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, StoreError>;
}

/// The floors of the benchmarks: the least work each path of the service can be made of, with
/// none of its protection. Not part of the service: compiled only with this crate's `bench`
/// feature, which the api's `bench` feature (its bench-only routes) turns on.
#[cfg(feature = "bench")]
#[async_trait]
pub trait FloorRepository: Send + Sync {
    /// Writes a charge, its ledger transaction and its event with no idempotency record at
    /// all: the floor of a first charge (the same writes as its finish, one commit).
    async fn write_charge_unguarded(&self, charge: &Charge) -> Result<(), StoreError>;

    /// Inserts a fresh pending record for `key` in one statement of its own, with
    /// `resource_id` as its generation and attempt 1, and returns its fence; no conflict
    /// handling, no decision. Followed by the finish's transaction over it
    /// ([`RecordRepository::begin_over`], [`ChargeRepository::insert_charge`],
    /// [`RecordRepository::end_record`]) it is the floor of a flow of two commits (the claim's
    /// insert, then the finish).
    async fn insert_pending_unguarded(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
        resource_id: uuid::Uuid,
    ) -> Result<payments_idempotency::engine::Fence, StoreError>;
}

/// Everything the service needs from its database.
#[async_trait]
pub trait Store:
    ChargeRepository
    + RefundRepository
    + PayoutRepository
    + WorkerRepository
    + OutboxRepository
    + EventRepository
    + ReconciliationRepository
    + ResolutionRepository
    + Debug
{
    fn backend(&self) -> Backend;

    /// The benchmark floors on the same database.
    #[cfg(feature = "bench")]
    fn floors(&self) -> &dyn FloorRepository;

    fn policy(&self) -> IdempotencyPolicy;

    /// The engine's record store on the same database: the claim, the fenced writes of an
    /// attempt, the transaction an operation's rows are written in, the completer's takeover
    /// and the reaper.
    fn records(&self) -> SqlRecords;

    /// Applies the backend's embedded migrations; safe to run from several instances at once.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Answers whether the database takes a query now.
    async fn ping(&self) -> Result<(), StoreError>;

    /// How durable the database's acknowledged commits are; like [`ping`](Self::ping), it
    /// fails when the database does not answer.
    async fn durability(&self) -> Result<Durability, StoreError>;
}
