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

mod claiming;
mod dialect;
mod error;
mod events;
mod fenced;
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
mod recording;
mod records;
mod redis_link;
mod refunding;
mod replay_cache;
mod repository;
mod resolving;
mod rows;
mod sql_store;
mod sqlite;
mod stream;
mod transaction;
mod workers;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use payments_idempotency::IdempotencyPolicy;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

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
pub use records::Records;
pub use redis_link::{RedisFailure, RedisLink, SentinelPasswords};
pub use replay_cache::{CacheSecret, CacheSecretTooShort, Rejection, ReplayCache};
#[cfg(feature = "bench")]
pub use repository::FloorRepository;
pub use repository::{
    Backend, ChargeRepository, EventRepository, OutboxRepository, PayoutRepository,
    ReconciliationRepository, RecordRepository, RefundRepository, ResolutionRepository, Store,
    WorkerRepository,
};
pub use stream::{EventSink, EventStream, OutboxEvent, RelayError, SinkError};
pub use transaction::Transaction;

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_connections: u32,
    /// How long a request waits for a connection (or, on SQLite, for another process's write)
    /// before it fails with 503: short, so a lost database fails requests fast instead of
    /// queueing them.
    pub acquire_timeout: Duration,
    /// PostgreSQL cancels a statement that runs longer (`statement_timeout`), so that a lock
    /// held forever or a node too loaded to answer fails a request as unavailable instead of
    /// holding it to its timeout. Migrations run without it.
    pub statement_timeout: Duration,
}

/// Where the data lives, parsed from a database URL.
#[derive(Clone)]
pub enum Database {
    /// `postgres://` or `postgresql://`.
    Postgres {
        url: String,
        options: PgConnectOptions,
    },
    /// `sqlite://path`, `sqlite:path` or `sqlite::memory:`.
    Sqlite(SqliteConnectOptions),
}

// The URL may carry a password: only the backend and the location are ever printed.
impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Database {
    /// Parses a database URL. The scheme is checked here because the drivers' parsers accept
    /// other schemes and would quietly connect to their defaults.
    pub fn parse(url: &str) -> Result<Self, String> {
        let scheme = url
            .split_once(':')
            .map(|(scheme, _)| scheme)
            .unwrap_or_default();
        match scheme {
            "postgres" | "postgresql" => PgConnectOptions::from_str(url)
                .map(|options| Self::Postgres {
                    url: url.to_owned(),
                    options,
                })
                .map_err(|e| format!("not a valid PostgreSQL URL ({e})")),
            "sqlite" => SqliteConnectOptions::from_str(url)
                .map(Self::Sqlite)
                .map_err(|e| format!("not a valid SQLite URL ({e})")),
            _ => Err(format!(
                "unsupported scheme {scheme:?}: expected postgres://, postgresql:// or sqlite:"
            )),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres { .. } => Backend::Postgres,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The backend and where it is, without credentials: `postgres at host:5432/db`,
    /// `sqlite at data/payments.db`, `sqlite in memory`.
    pub fn describe(&self) -> String {
        match self {
            Self::Postgres { options, .. } => format!(
                "postgres at {}:{}/{}",
                options.get_host(),
                options.get_port(),
                options.get_database().unwrap_or_default()
            ),
            Self::Sqlite(options) if is_in_memory(options) => "sqlite in memory".to_owned(),
            Self::Sqlite(options) => {
                format!("sqlite at {}", options.get_filename().display())
            }
        }
    }

    /// Opens the store and brings its schema up to date. PostgreSQL's database is created if
    /// missing and its pool connects lazily afterwards; SQLite's file and directory are created
    /// if missing.
    pub async fn open(
        &self,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Result<Arc<dyn Store>, StoreError> {
        let store: Arc<dyn Store> = match self {
            Self::Postgres { url, options } => {
                PgStore::create_database_if_missing(url).await?;
                Arc::new(PgStore::connect_lazy(options.clone(), settings, policy))
            }
            Self::Sqlite(options) => {
                Arc::new(SqliteStore::open(options.clone(), settings, policy).await?)
            }
        };
        store.migrate().await?;
        Ok(store)
    }
}

fn is_in_memory(options: &SqliteConnectOptions) -> bool {
    options
        .get_filename()
        .to_string_lossy()
        .starts_with("file:sqlx-in-memory")
}
