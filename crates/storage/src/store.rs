//! [`DatabaseStore`], the service's store on one database of either backend, over the engine's
//! record store on the same database, whose pool (and, on SQLite, write gate) it shares. Its
//! repositories are implemented in the files named for what they hold (`reading.rs` the
//! charges, `refunding.rs`, `paying_out.rs`, …); what a backend does its own way is in
//! `postgres.rs` and `sqlite.rs`; the outbox's upkeep and `Store` itself are here.

use std::time::Duration;

use async_trait::async_trait;
use payments_idempotency::IdempotencyPolicy;
use payments_idempotency_sql::{Connection, SqlRecords};
use sqlx::pool::PoolConnection;
use sqlx::{Postgres, Sqlite};

use crate::model::{Backlog, Durability, EventPruning};
use crate::relay::{EventSink, RelayError};
use crate::repository::{OutboxRepository, Store, WorkerRepository};
use crate::sql::{Each, Sql};
use crate::{Backend, StoreError, Transaction, postgres, sqlite};

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

#[async_trait]
impl Store for DatabaseStore {
    fn backend(&self) -> Backend {
        self.records.backend()
    }

    #[cfg(feature = "bench")]
    fn floors(&self) -> &dyn crate::FloorRepository {
        self
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.records.policy()
    }

    fn records(&self) -> SqlRecords {
        self.records.clone()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let migrated = match &self.records {
            SqlRecords::Postgres(records) => postgres::migrate(records.pool()).await,
            SqlRecords::Sqlite(records) => sqlite::migrate(records).await,
        };
        migrated.map_err(|e| StoreError::Migration(e.to_string()))
    }

    async fn durability(&self) -> Result<Durability, StoreError> {
        match &self.records {
            SqlRecords::Postgres(records) => postgres::durability(records.pool()).await,
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
        match &self.records {
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
