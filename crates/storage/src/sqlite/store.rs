//! What SQLite's store does its own way ([`SqlStore`]): every write runs in a write
//! transaction, so a claim's insert, read and decision are one `BEGIN IMMEDIATE`, and a
//! charge's finish is its completion, then its inserts, in one transaction.

use async_trait::async_trait;
use payments_idempotency::IdempotencyPolicy;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

use super::charges::insert_charge_writes;
use super::{MIGRATOR, SqliteStore, WriteTx};
use crate::StoreError;
use crate::claiming::NewClaim;
use crate::fenced;
use crate::model::{Claim, Completion, Durability};
use crate::recording::{self, ChargeFinish};
use crate::repository::{Backend, Store};
use crate::sql_store::{SqlStore, complete_on};
use crate::stream::{EventSink, RelayError};

#[async_trait]
impl SqlStore for SqliteStore {
    type Db = Sqlite;
    type Write<'s> = WriteTx<'s>;

    const BACKEND: Backend = Backend::Sqlite;

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.policy
    }

    async fn begin_write(&self) -> Result<WriteTx<'_>, StoreError> {
        self.begin_immediate().await
    }

    async fn commit(write: Self::Write<'_>) -> Result<(), StoreError> {
        write.commit().await
    }

    /// Every write, one statement or several, takes the write lock.
    type OneWrite<'s> = WriteTx<'s>;

    async fn begin_one_write(&self) -> Result<WriteTx<'_>, StoreError> {
        self.begin_immediate().await
    }

    async fn end_one_write(write: Self::OneWrite<'_>) -> Result<(), StoreError> {
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

    /// The fenced completion of the record gates the inserts: when it matches no row, the
    /// transaction is dropped (rolled back) having written nothing.
    async fn write_charge(&self, finish: ChargeFinish<'_>) -> Result<Completion, StoreError> {
        let complete = fenced::complete::<Sqlite>(finish.owner, finish.response, self.policy.ttl)?;
        let mut write = self.begin_immediate().await?;
        let completion = complete_on::<Sqlite>(&mut write, complete).await?;
        if completion == Completion::Fenced {
            return Ok(Completion::Fenced);
        }
        insert_charge_writes(&mut write, finish.charge).await?;
        write.commit().await?;
        Ok(completion)
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
