//! What a backend's store supplies, as one trait, [`SqlStore`]: its pool, policy and record
//! store, its write path and the transaction the engine holds, a charge's inserts and how the
//! outbox relay takes its rows. Everything else is written once over it, as plain generic impls:
//! `ChargeRepository` (`reading.rs`), `RefundRepository`
//! (`refunding.rs`), `PayoutRepository` (`paying_out.rs`), `WorkerRepository` (`workers.rs`),
//! the bench floors (`floors.rs`), and `Store` and `OutboxRepository` here.

use std::fmt::Debug;
use std::ops::DerefMut;

use async_trait::async_trait;
use payments_idempotency::IdempotencyPolicy;
use sqlx::{Database, Pool};

use crate::StoreError;
use payments_idempotency_sql::SqlRecords;

use crate::Backend;
use crate::Transaction;
use crate::dialect::{Dialect, Statement};
use crate::model::{Backlog, Durability, EventPruning};
use crate::outbox;
use crate::repository::{OutboxRepository, Store};
use crate::stream::{EventSink, RelayError};

/// A backend's store: the little that differs between PostgreSQL and SQLite beyond the SQL
/// its [`Dialect`] writes.
#[async_trait]
pub(crate) trait SqlStore: Debug + Send + Sync {
    type Db: Dialect;

    /// A write transaction: PostgreSQL's transaction; SQLite's in-process write gate and its
    /// `BEGIN IMMEDIATE` transaction, which holds the database's write lock. It is what a
    /// [`Transaction`] holds.
    type Write: DerefMut<Target = <Self::Db as Database>::Connection> + Send + Into<Transaction>;

    const BACKEND: Backend;

    fn pool(&self) -> &Pool<Self::Db>;

    fn policy(&self) -> IdempotencyPolicy;

    /// The engine's record store on the same database, whose pool this store shares.
    fn records(&self) -> SqlRecords;

    /// Begins a write transaction. Cancel-safe: a caller dropped while it begins leaves no
    /// transaction open on a pooled connection.
    async fn begin_write(&self) -> Result<Self::Write, StoreError>;

    async fn commit(write: Self::Write) -> Result<(), StoreError>;

    /// The backend's write transaction in `transaction`.
    fn write_in(transaction: &mut Transaction) -> Result<&mut Self::Write, StoreError>;

    /// Where one write statement (a fenced write, a takeover, a prune) runs on its own:
    /// PostgreSQL's pooled connection, autocommit; SQLite's write transaction.
    type OneWrite: DerefMut<Target = <Self::Db as Database>::Connection> + Send;

    async fn begin_one_write(&self) -> Result<Self::OneWrite, StoreError>;

    /// Ends the one write: nothing to do on PostgreSQL, the commit on SQLite.
    async fn end_one_write(write: Self::OneWrite) -> Result<(), StoreError>;

    /// Runs one write statement on its own and returns the rows it changed.
    async fn write_one(&self, sql: Statement<'_, Self::Db>) -> Result<u64, StoreError> {
        let mut write = self.begin_one_write().await?;
        let changed = sql.execute(&mut write).await?;
        Self::end_one_write(write).await?;
        Ok(changed)
    }

    /// A charge's inserts (the charge, its ledger transaction and its event), on the caller's
    /// transaction (PostgreSQL: one statement; SQLite: one statement each).
    async fn insert_charge(
        connection: &mut <Self::Db as Database>::Connection,
        charge: &payments_domain::Charge,
    ) -> Result<(), StoreError>;

    /// Publishes up to `batch` unpublished events and marks them published, each backend its
    /// own way (`WorkerRepository::relay_outbox`).
    async fn relay(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError>;

    /// Applies the backend's embedded migrations.
    async fn run_migrations(&self) -> Result<(), sqlx::migrate::MigrateError>;

    /// How durable the database's acknowledged commits are (`Store::durability`).
    async fn durability(&self) -> Result<Durability, StoreError>;

    /// The finish's inserts without a record: the floor of a first charge.
    #[cfg(feature = "bench")]
    async fn write_charge_alone(&self, charge: &payments_domain::Charge) -> Result<(), StoreError>;
}

/// A transaction of the other backend than the store's: never made by the service, which
/// opens one store.
pub(crate) fn of_another_backend() -> StoreError {
    StoreError::Corrupt("a transaction of another backend's store".to_owned())
}

#[async_trait]
impl<S: SqlStore> Store for S {
    fn backend(&self) -> Backend {
        S::BACKEND
    }

    #[cfg(feature = "bench")]
    fn floors(&self) -> &dyn crate::FloorRepository {
        self
    }

    fn policy(&self) -> IdempotencyPolicy {
        SqlStore::policy(self)
    }

    fn records(&self) -> SqlRecords {
        SqlStore::records(self)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.run_migrations()
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        SqlStore::durability(self).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.pool().acquire().await?;
        Statement::<S::Db>::new("SELECT 1")
            .execute(&mut connection)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl<S: SqlStore> OutboxRepository for S {
    async fn outbox_backlog(&self) -> Result<Backlog, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let row = outbox::backlog::<S::Db>()
            .fetch_one(&mut connection)
            .await?;
        Ok(Backlog::from_row(row))
    }

    async fn prune_events(
        &self,
        pruning: EventPruning,
        retention: std::time::Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        self.write_one(outbox::prune(pruning, retention, batch))
            .await
    }
}
