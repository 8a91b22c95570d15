//! `Store`, everything the service needs from its database, implemented for [`DatabaseStore`]
//! (`database.rs`), the store on one database of either backend. Each repository `Store` is
//! made of lives in the file of its resource (`charges.rs`, `refunds.rs`,
//! `payouts.rs`, `events.rs`, `reconciliation.rs`, `resolutions.rs`) with its types, its rows
//! and its statements; what a backend does its own way is in `postgres.rs` and `sqlite.rs`; the
//! outbox's upkeep, the relay and `Store` itself are here.
//!
//! Every repository keeps these promises, and the storage and black-box suites check them
//! against each backend:
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

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use payments_idempotency::IdempotencyPolicy;
use payments_idempotency_sql::SqlRecords;

use crate::charges::ChargeRepository;
use crate::database::DatabaseStore;
use crate::events::EventRepository;
#[cfg(feature = "bench")]
use crate::floors::FloorRepository;
use crate::payouts::PayoutRepository;
use crate::reconciliation::ReconciliationRepository;
use crate::refunds::RefundRepository;
use crate::relay::{EventSink, RelayError};
use crate::resolutions::ResolutionRepository;
use crate::sql::{Each, Sql};
use crate::{Backend, StoreError, postgres, sqlite};

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

/// What the outbox relay needs, each backend its own way. (The completer's takeover and the
/// reaper are the record store's: [`Store::records`].)
#[async_trait]
pub trait WorkerRepository: Send + Sync {
    /// Publishes up to `batch` unpublished events and marks them published; returns how many.
    /// Rows are marked only after the stream accepted them: at least once, never lost.
    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError>;
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

/// Which outbox rows the reaper deletes once they are older than the retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPruning {
    /// A stream relays the rows: only those it has taken (published) go, by the time they
    /// were published; an unpublished row stays however old.
    Published,
    /// No stream: the events API is the rows' only reader, and they go by age alone.
    ByAge,
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

#[async_trait]
impl Store for DatabaseStore {
    fn backend(&self) -> Backend {
        self.record_store().backend()
    }

    #[cfg(feature = "bench")]
    fn floors(&self) -> &dyn FloorRepository {
        self
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.record_store().policy()
    }

    fn records(&self) -> SqlRecords {
        self.record_store().clone()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let migrated = match self.record_store() {
            SqlRecords::Postgres(records) => postgres::migrate(records.pool()).await,
            SqlRecords::Sqlite(records) => sqlite::migrate(records).await,
        };
        migrated.map_err(|e| StoreError::Migration(e.to_string()))
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        match self.record_store() {
            SqlRecords::Postgres(records) => {
                let (commit, standbys) = postgres::synchronous_settings(records.pool()).await?;
                Ok(Durability::of_postgres(&commit, &standbys))
            }
            // One file on one machine: a commit is as durable as that disk
            // (`synchronous = FULL`).
            SqlRecords::Sqlite(_) => {
                self.ping().await?;
                Ok(Durability::Local)
            }
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.acquire().await?;
        Sql::new("SELECT 1")
            .execute(&mut connection.connection())
            .await?;
        Ok(())
    }
}

#[async_trait]
impl WorkerRepository for DatabaseStore {
    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        match self.record_store() {
            SqlRecords::Postgres(records) => postgres::relay_outbox(records, batch, sink).await,
            SqlRecords::Sqlite(records) => sqlite::relay_outbox(records, batch, sink).await,
        }
    }
}

/// The number of unpublished events and the age of the oldest in seconds (`NULL` when there is
/// none).
const OUTBOX_BACKLOG: Each = Each {
    postgres: "
SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
FROM outbox_events WHERE published_at IS NULL",
    sqlite: "
SELECT count(*), (julianday('now') - julianday(min(created_at))) * 86400.0
FROM outbox_events WHERE published_at IS NULL",
};

/// Deletes up to `$2` published events published more than `$1` seconds ago, the oldest
/// first. `published_at IS NOT NULL` is spelled out although the comparison implies it: an
/// unpublished row must never go, however old, and the index `outbox_events_published` finds
/// the old rows without reading the whole table. `SKIP LOCKED` keeps the reapers of several
/// instances on disjoint rows.
const PRUNE_PUBLISHED: Each = Each {
    postgres: "
DELETE FROM outbox_events WHERE id IN (
    SELECT id FROM outbox_events
    WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1)
    ORDER BY published_at LIMIT $2
    FOR UPDATE SKIP LOCKED)",
    sqlite: "
DELETE FROM outbox_events WHERE id IN (
    SELECT id FROM outbox_events
    WHERE published_at IS NOT NULL
      AND published_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || $1 || ' seconds')
    ORDER BY published_at LIMIT $2)",
};

/// Deletes up to `$2` events written more than `$1` seconds ago, published or not, the oldest
/// first (the index `outbox_events_created` finds them).
const PRUNE_BY_AGE: Each = Each {
    postgres: "
DELETE FROM outbox_events WHERE id IN (
    SELECT id FROM outbox_events
    WHERE created_at < now() - make_interval(secs => $1)
    ORDER BY created_at LIMIT $2
    FOR UPDATE SKIP LOCKED)",
    sqlite: "
DELETE FROM outbox_events WHERE id IN (
    SELECT id FROM outbox_events
    WHERE created_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || $1 || ' seconds')
    ORDER BY created_at LIMIT $2)",
};

#[async_trait]
impl OutboxRepository for DatabaseStore {
    async fn outbox_backlog(&self) -> Result<Backlog, StoreError> {
        let mut connection = self.acquire().await?;
        let row = Sql::new(OUTBOX_BACKLOG)
            .fetch_one(&mut connection.connection())
            .await?;
        Ok(Backlog::from_row(row))
    }

    async fn prune_events(
        &self,
        pruning: EventPruning,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let statement = match pruning {
            EventPruning::Published => PRUNE_PUBLISHED,
            EventPruning::ByAge => PRUNE_BY_AGE,
        };
        let prune = Sql::new(statement)
            .bind(retention.as_secs_f64())
            .bind(batch);
        self.write_one(prune).await
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
