//! [`DatabaseStore`]: the payments store on one database of either backend, over the engine's
//! record store on the same database, whose pool (and, on SQLite, write gate) it shares. Every
//! repository is implemented for it in the file of its resource; `Store` in `store.rs`.

use payments_idempotency_sql::{Connection, SqlRecords};
use sqlx::pool::PoolConnection;
use sqlx::{Postgres, Sqlite};

use crate::sql::Sql;
use crate::{StoreError, Transaction};

/// The payments store on one database. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct DatabaseStore {
    records: SqlRecords,
}

/// A connection from the pool, for reads and for PostgreSQL's one-statement writes.
pub(crate) enum Pooled {
    Postgres(PoolConnection<Postgres>),
    Sqlite(PoolConnection<Sqlite>),
}

impl Pooled {
    pub(crate) fn connection(&mut self) -> Connection<'_> {
        match self {
            Self::Postgres(connection) => Connection::Postgres(connection),
            Self::Sqlite(connection) => Connection::Sqlite(connection),
        }
    }
}

impl DatabaseStore {
    pub(crate) fn new(records: SqlRecords) -> Self {
        Self { records }
    }

    pub(crate) fn record_store(&self) -> &SqlRecords {
        &self.records
    }

    /// A connection from the pool.
    pub(crate) async fn acquire(&self) -> Result<Pooled, StoreError> {
        Ok(match &self.records {
            SqlRecords::Postgres(records) => Pooled::Postgres(records.pool().acquire().await?),
            SqlRecords::Sqlite(records) => Pooled::Sqlite(records.pool().acquire().await?),
        })
    }

    /// Begins a write transaction of the service's own (not over a record). Cancel-safe: a
    /// caller dropped while it begins leaves no transaction open on a pooled connection.
    pub(crate) async fn begin_write(&self) -> Result<Transaction, StoreError> {
        Ok(self.records.begin_write().await?)
    }

    /// Runs one write statement on its own and returns the rows it changed: on PostgreSQL on a
    /// pooled connection, as its own transaction; on SQLite in a write transaction, which
    /// every write takes.
    pub(crate) async fn write_one(&self, sql: Sql<'_>) -> Result<u64, StoreError> {
        match &self.records {
            SqlRecords::Postgres(_) => {
                let mut connection = self.acquire().await?;
                Ok(sql.execute(&mut connection.connection()).await?)
            }
            SqlRecords::Sqlite(_) => {
                let mut write = self.begin_write().await?;
                let changed = sql.execute(&mut write.connection()).await?;
                write.commit().await?;
                Ok(changed)
            }
        }
    }
}
