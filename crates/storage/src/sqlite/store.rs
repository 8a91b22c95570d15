//! What SQLite's store does its own way ([`SqlStore`]): every write runs in a write
//! transaction, so a claim's insert, read and decision are one `BEGIN IMMEDIATE`, and a
//! charge's inserts are one statement each.

use async_trait::async_trait;
use payments_idempotency::IdempotencyPolicy;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

use super::charges::insert_charge_writes;
use super::{MIGRATOR, SqliteStore, WriteTx};
use crate::StoreError;
use crate::claiming::NewClaim;
use crate::model::{Claim, Durability};
use crate::recording;
use crate::repository::{Backend, Store};
use crate::sql_store::SqlStore;
use crate::stream::{EventSink, RelayError};
use crate::transaction::{self, Begun, Transaction};

#[async_trait]
impl SqlStore for SqliteStore {
    type Db = Sqlite;
    type Write = WriteTx;

    const BACKEND: Backend = Backend::Sqlite;

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.policy
    }

    async fn begin_write(&self) -> Result<WriteTx, StoreError> {
        self.begin_immediate().await
    }

    async fn commit(write: WriteTx) -> Result<(), StoreError> {
        write.commit().await
    }

    fn write_in(transaction: &mut Transaction) -> Result<&mut WriteTx, StoreError> {
        match &mut transaction.0 {
            Begun::Sqlite(write) => Ok(write),
            Begun::Postgres(_) => Err(transaction::of_another_backend()),
        }
    }

    fn into_write(transaction: Transaction) -> Result<WriteTx, StoreError> {
        match transaction.0 {
            Begun::Sqlite(write) => Ok(write),
            Begun::Postgres(_) => Err(transaction::of_another_backend()),
        }
    }

    /// Every write, one statement or several, takes the write lock.
    type OneWrite = WriteTx;

    async fn begin_one_write(&self) -> Result<WriteTx, StoreError> {
        self.begin_immediate().await
    }

    async fn end_one_write(write: WriteTx) -> Result<(), StoreError> {
        write.commit().await
    }

    /// The insert, the read and the decision run in one `BEGIN IMMEDIATE` transaction: the
    /// write lock is held from the first statement, so no other claim can interleave. Replays,
    /// 409s and 422s never get here: the lock-free read of `RecordRepository::claim` answers
    /// them without the write lock.
    async fn claim_under_lock(&self, claim: NewClaim<'_>) -> Result<Claim, StoreError> {
        let mut write = self.begin_immediate().await?;
        let inserted = recording::insert_pending::<Sqlite>(&mut write, &claim, self.policy);
        if let Some(claimed) = inserted.await? {
            write.commit().await?;
            return Ok(Claim::Owned(claimed));
        }
        let corrupt = |what: &str| StoreError::Corrupt(format!("key {} {what}", claim.key));
        let found = recording::read_record::<Sqlite>(&mut write, claim.scope, claim.key, false)
            .await?
            .ok_or_else(|| corrupt("neither inserts nor reads back"))?;
        // Under the write lock the record read just now cannot be absent.
        let outcome = recording::act_on_locked::<Sqlite>(&mut write, found, &claim, self.policy)
            .await?
            .ok_or_else(|| corrupt("exists but was judged absent"))?;
        write.commit().await?;
        Ok(outcome)
    }

    async fn insert_charge(
        connection: &mut SqliteConnection,
        charge: &payments_domain::Charge,
    ) -> Result<(), StoreError> {
        insert_charge_writes(connection, charge).await
    }

    async fn relay(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        self.relay_outbox_leased(batch, sink).await
    }

    /// One file on one machine: a commit is as durable as that disk (`synchronous = FULL`).
    async fn durability(&self) -> Result<Durability, StoreError> {
        Store::ping(self).await?;
        Ok(Durability::Local)
    }

    /// Migrations write: several processes starting on one file take turns.
    async fn run_migrations(&self) -> Result<(), sqlx::migrate::MigrateError> {
        let _gate = self.write_gate.lock().await;
        MIGRATOR.run(&self.pool).await
    }

    /// The finish's inserts, in one write transaction of their own.
    #[cfg(feature = "bench")]
    async fn write_charge_alone(&self, charge: &payments_domain::Charge) -> Result<(), StoreError> {
        let mut write = self.begin_immediate().await?;
        insert_charge_writes(&mut write, charge).await?;
        write.commit().await?;
        Ok(())
    }
}
