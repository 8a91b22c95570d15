//! What PostgreSQL's store does its own way ([`SqlStore`]): one write statement runs on the
//! pool, and a charge's inserts are one statement.

use async_trait::async_trait;
use payments_domain::Charge;
use payments_idempotency::IdempotencyPolicy;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use super::MIGRATOR;
use super::PgStore;
use super::charges::push_charge_writes;
use crate::Backend;
use crate::StoreError;
use crate::dialect::{Statement, answered};
use crate::model::Durability;
use crate::sql_store::{SqlStore, of_another_backend};
use crate::stream::{EventSink, RelayError};
use payments_idempotency_sql::SqlRecords;

#[async_trait]
impl SqlStore for PgStore {
    type Db = Postgres;
    type Write = Transaction<'static, Postgres>;

    const BACKEND: Backend = Backend::Postgres;

    fn pool(&self) -> &PgPool {
        self.records.pool()
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.records.policy()
    }

    fn records(&self) -> SqlRecords {
        SqlRecords::Postgres(self.records.clone())
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        self.begin().await
    }

    async fn commit(write: Self::Write) -> Result<(), StoreError> {
        Ok(answered::<Postgres, _>(write.commit()).await?)
    }

    fn write_in(
        transaction: &mut crate::Transaction,
    ) -> Result<&mut Transaction<'static, Postgres>, StoreError> {
        match transaction {
            crate::Transaction::Postgres(write) => Ok(write),
            crate::Transaction::Sqlite(_) => Err(of_another_backend()),
        }
    }

    /// Autocommit: one statement is its own transaction.
    type OneWrite = PoolConnection<Postgres>;

    async fn begin_one_write(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        Ok(self.pool().acquire().await?)
    }

    async fn end_one_write(_: Self::OneWrite) -> Result<(), StoreError> {
        Ok(())
    }

    /// A charge, its balanced ledger transaction and its event as ONE statement
    /// (`push_charge_writes`, behind a gate that always yields its row): either all of them
    /// exist or none does. The ledger's balance trigger and the foreign keys are checked at
    /// the end of the statement and at commit as usual.
    async fn insert_charge(
        connection: &mut PgConnection,
        charge: &Charge,
    ) -> Result<(), StoreError> {
        let mut sql = Statement::new("WITH gate AS (SELECT 1), ");
        push_charge_writes(&mut sql, charge)?;
        sql.push(" SELECT count(*) FROM gate");
        let _: (i64,) = sql.fetch_one(connection).await?;
        Ok(())
    }

    async fn relay(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        self.relay_outbox_locked(batch, sink).await
    }

    /// sqlx takes an advisory lock around the migrations, so instances may start together.
    ///
    /// Migrations may rewrite a large table: they run on a connection of their own without
    /// the statement timeout, which is closed afterwards rather than pooled.
    async fn run_migrations(&self) -> Result<(), sqlx::migrate::MigrateError> {
        let mut connection = self.pool().acquire().await?;
        connection.close_on_drop();
        Statement::<Postgres>::new("SET statement_timeout = 0")
            .execute(&mut connection)
            .await
            .map_err(|e| sqlx::migrate::MigrateError::Source(Box::new(e)))?;
        MIGRATOR.run_direct(&mut *connection).await
    }

    /// Read from the settings of a pooled connection, so that a session-level
    /// `synchronous_commit` (in the URL's options) counts too.
    async fn durability(&self) -> Result<Durability, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let (commit, standbys): (String, String) = Statement::<Postgres>::new(
            "SELECT current_setting('synchronous_commit'), \
             current_setting('synchronous_standby_names')",
        )
        .fetch_one(&mut connection)
        .await?;
        Ok(Durability::of_postgres(&commit, &standbys))
    }

    /// The finish's very inserts ([`insert_charge`](SqlStore::insert_charge)): one statement,
    /// one commit, no idempotency record at all.
    #[cfg(feature = "bench")]
    async fn write_charge_alone(&self, charge: &Charge) -> Result<(), StoreError> {
        let mut connection = self.pool().acquire().await?;
        Self::insert_charge(&mut connection, charge).await
    }
}
