//! Persistence for the payments service: idempotency records, charges, the double-entry ledger
//! and the outbox, behind repository traits with two backends, PostgreSQL (deployments) and
//! SQLite (the embedded mode), and the migrations of each.
//!
//! Each statement is written whole, as SQL one can paste into `psql` or `sqlite3`, beside the
//! code that runs it (`sql.rs` says how); where the dialects differ, the two texts stand side
//! by side. Rows are read back as `FromRow` rows and converted to domain and protocol types
//! here, at the edge, so nothing above this crate sees a database type. Each multi-statement
//! step runs in a transaction this crate opens and commits. This crate must not import axum or
//! any HTTP type, nor Redis: the outbox relay publishes through a port, [`EventSink`], which
//! `payments-redis` implements.

pub mod captures;
mod charges;
mod database;
mod error;
mod events;
#[cfg(feature = "bench")]
mod floors;
mod holding;
mod payouts;
mod postgres;
mod posting;
mod reconciliation;
mod refunds;
mod relay;
mod resolutions;
mod rows;
mod sql;
mod sqlite;
mod store;

use std::sync::Arc;

use payments_idempotency::IdempotencyPolicy;

use crate::database::DatabaseStore;

pub(crate) use payments_idempotency::engine::Owner;

pub use charges::{Balance, ChargePage, ChargeRepository, ListCharges};
pub use error::StoreError;
pub use events::{EventPage, EventRepository, ListEvents, StoredEvent};
#[cfg(feature = "bench")]
pub use floors::FloorRepository;
pub use payments_idempotency_sql::{
    Backend, CommitObserver, Database, GroupCommit, GroupCommits, PendingEffect, PoolSettings,
    Transaction,
};
pub use payouts::{Funds, ListPayouts, PayoutPage, PayoutRepository, PayoutReservation};
pub use reconciliation::{
    BooksSide, ExceptionPage, ExceptionStatus, ListExceptions, ProcessorSide,
    ReconciliationException, ReconciliationRepository, Resolution, SavedRun,
};
pub use refunds::{ListRefunds, RefundPage, RefundRefusal, RefundRepository, Reservation};
pub use relay::{EventSink, OutboxEvent, RelayError, SinkError};
pub use resolutions::{ExceptionHold, HeldEnd, NewResolution, Posting, ResolutionRepository};
pub use store::{Backlog, Durability, EventPruning, OutboxRepository, Store, WorkerRepository};

/// Opens the store on `database` and brings its schema up to date. PostgreSQL's database is
/// created if missing and its pool connects lazily afterwards; SQLite's file and directory are
/// created if missing.
pub async fn open_store(
    database: &Database,
    settings: &PoolSettings,
    policy: IdempotencyPolicy,
) -> Result<Arc<dyn Store>, StoreError> {
    let store: Arc<dyn Store> =
        Arc::new(DatabaseStore::new(database.open(settings, policy).await?));
    store.migrate().await?;
    Ok(store)
}
