//! Persistence for the payments service: idempotency records, charges, the double-entry ledger
//! and the outbox, behind repository traits with two backends, PostgreSQL (deployments) and
//! SQLite (the embedded mode), and the migrations of each.
//!
//! Statements are built one way, as a `Statement` whose fragments bind their values where they
//! name them, and read back as `FromRow` rows: the SQL is visible where it runs, and rows are
//! converted to domain and protocol types here, at the edge, so nothing above
//! this crate sees a database type. Each multi-statement step runs in a transaction this crate
//! opens and commits. This crate must not import axum or any HTTP type. Redis (the replay
//! cache, the event stream) is only ever an accelerator and a transport: nothing here treats it
//! as a source of truth.

mod dialect;
mod error;
mod events;
#[cfg(feature = "bench")]
mod floors;
mod holding;
mod model;
mod outbox;
mod paying_out;
mod postgres;
mod posting;
mod reading;
mod reconciling;
mod redis_link;
mod refunding;
mod replay_cache;
mod repository;
mod resolving;
mod rows;
mod sql_store;
mod sqlite;
mod stream;
mod workers;

use std::sync::Arc;

use payments_idempotency::IdempotencyPolicy;
use payments_idempotency_sql::SqlRecords;

use crate::postgres::PgStore;
use crate::sqlite::SqliteStore;

pub use error::StoreError;
pub use model::{
    Backlog, Balance, BooksSide, ChargePage, Durability, EventPage, EventPruning, ExceptionHold,
    ExceptionPage, ExceptionStatus, Funds, HeldEnd, ListCharges, ListEvents, ListExceptions,
    ListPayouts, ListRefunds, NewResolution, PayoutPage, PayoutReservation, PendingEffect, Posting,
    ProcessorSide, ReconciliationException, RefundPage, RefundRefusal, Reservation, Resolution,
    SavedRun, StoredEvent,
};
pub use payments_idempotency_sql::{Backend, Database, PoolSettings, Transaction};
pub use redis_link::{RedisFailure, RedisLink, SentinelPasswords};
pub use replay_cache::{CacheSecret, CacheSecretTooShort, Rejection, ReplayCache};
#[cfg(feature = "bench")]
pub use repository::FloorRepository;
pub use repository::{
    ChargeRepository, EventRepository, OutboxRepository, PayoutRepository,
    ReconciliationRepository, RefundRepository, ResolutionRepository, Store, WorkerRepository,
};
pub use stream::{EventSink, EventStream, OutboxEvent, RelayError, SinkError};

/// Opens the store on `database` and brings its schema up to date. PostgreSQL's database is
/// created if missing and its pool connects lazily afterwards; SQLite's file and directory are
/// created if missing.
pub async fn open_store(
    database: &Database,
    settings: &PoolSettings,
    policy: IdempotencyPolicy,
) -> Result<Arc<dyn Store>, StoreError> {
    let store: Arc<dyn Store> = match database.open(settings, policy).await? {
        SqlRecords::Postgres(records) => Arc::new(PgStore::new(records)),
        SqlRecords::Sqlite(records) => Arc::new(SqliteStore::new(records)),
    };
    store.migrate().await?;
    Ok(store)
}
