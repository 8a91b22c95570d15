//! The PostgreSQL repositories: the backend for deployments with several instances.
//!
//! Row locks (`FOR UPDATE`, `SKIP LOCKED`) serialise what must be serialised and let
//! instances share the work of the background workers; the finish is one statement.
//!
//! The layout is the SQLite backend's: this module is the store itself, `store.rs` what it
//! does its own way (`SqlStore`: the claim's lock, the write path, the finish), `charges.rs`
//! the inserts of a charge's finish, `dialect.rs` its SQL dialect, and `relay.rs`
//! how its outbox relay takes rows. Everything else is shared, written once over `SqlStore`.

mod charges;
mod dialect;
mod relay;
mod store;

use payments_idempotency_sql::PgRecords;
use sqlx::{PgPool, Postgres, Transaction};

use crate::StoreError;

/// The migrations under `migrations/postgres`, embedded in the binary.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// The PostgreSQL store, over the engine's PostgreSQL record store, whose pool it shares.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    records: PgRecords,
}

impl PgStore {
    pub(crate) fn new(records: PgRecords) -> Self {
        Self { records }
    }

    fn pool(&self) -> &PgPool {
        self.records.pool()
    }

    /// Begins a transaction, cancel-safe (`PgRecords::begin_transaction`).
    async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(self.records.begin_transaction().await?)
    }
}
