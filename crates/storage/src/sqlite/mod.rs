//! The SQLite repositories: the embedded backend, one file (or memory) and no server.
//!
//! SQLite has one writer at a time and no row locks, so the guarantees are kept differently
//! from PostgreSQL, with the same outcomes:
//! - every read-then-write step runs in a `BEGIN IMMEDIATE` transaction, which takes the
//!   database's write lock before its first read: two claims of one key cannot both see it
//!   free or stale, whether they come from one process or several;
//! - inside one process, writers also queue on an async mutex first, so they wait their turn
//!   in order instead of spinning in SQLite's busy handler;
//! - the clock is SQLite's (`strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`), so lock expiry is judged
//!   the same way by every process on the file.

//!
//! The layout is the PostgreSQL backend's: this module is the store itself, `store.rs` what it
//! does its own way (`SqlStore`: the claim's lock, the write path, the finish), `charges.rs`
//! the inserts of a charge's finish, `dialect.rs` its SQL dialect, and `relay.rs`
//! how its outbox relay takes rows. Everything else is shared, written once over `SqlStore`.

mod charges;
mod dialect;
mod relay;
mod store;

use payments_idempotency_sql::{SqliteRecords, WriteTx};
use sqlx::SqlitePool;

use crate::StoreError;

/// The migrations under `migrations/sqlite`, embedded in the binary.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// The SQLite store, over the engine's SQLite record store, whose pool and write gate it
/// shares: the service's writes and the engine's queue at the same gate. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct SqliteStore {
    records: SqliteRecords,
}

impl SqliteStore {
    pub(crate) fn new(records: SqliteRecords) -> Self {
        Self { records }
    }

    fn pool(&self) -> &SqlitePool {
        self.records.pool()
    }

    /// Begins a write transaction that holds the write lock from its first statement on.
    pub(crate) async fn begin_immediate(&self) -> Result<WriteTx, StoreError> {
        Ok(self.records.begin_write().await?)
    }
}
