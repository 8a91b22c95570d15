//! What SQLite's store does its own way ([`SqlStore`]): every write runs in a write
//! transaction, and a charge's inserts are one statement each.

use async_trait::async_trait;
use payments_idempotency::IdempotencyPolicy;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

use super::charges::insert_charge_writes;
use payments_idempotency_sql::SqlRecords;

use super::{MIGRATOR, SqliteStore, WriteTx};
use crate::Backend;
use crate::StoreError;
use crate::Transaction;
use crate::model::Durability;
use crate::repository::Store;
use crate::sql_store::{SqlStore, of_another_backend};
use crate::stream::{EventSink, RelayError};

#[async_trait]
impl SqlStore for SqliteStore {
    type Db = Sqlite;
    type Write = WriteTx;

    const BACKEND: Backend = Backend::Sqlite;

    fn pool(&self) -> &SqlitePool {
        self.records.pool()
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.records.policy()
    }

    fn records(&self) -> SqlRecords {
        SqlRecords::Sqlite(self.records.clone())
    }

    async fn begin_write(&self) -> Result<WriteTx, StoreError> {
        self.begin_immediate().await
    }

    async fn commit(write: WriteTx) -> Result<(), StoreError> {
        Ok(write.commit().await?)
    }

    fn write_in(transaction: &mut Transaction) -> Result<&mut WriteTx, StoreError> {
        match transaction {
            Transaction::Sqlite(write) => Ok(write),
            Transaction::Postgres(_) => Err(of_another_backend()),
        }
    }

    /// Every write, one statement or several, takes the write lock.
    type OneWrite = WriteTx;

    async fn begin_one_write(&self) -> Result<WriteTx, StoreError> {
        self.begin_immediate().await
    }

    async fn end_one_write(write: WriteTx) -> Result<(), StoreError> {
        Ok(write.commit().await?)
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
        let _gate = self.records.lock_writes().await;
        MIGRATOR.run(self.pool()).await
    }

    /// The finish's inserts, in one write transaction of their own.
    #[cfg(feature = "bench")]
    async fn write_charge_alone(&self, charge: &payments_domain::Charge) -> Result<(), StoreError> {
        let mut write = self.begin_immediate().await?;
        insert_charge_writes(&mut write, charge).await?;
        Ok(write.commit().await?)
    }
}
