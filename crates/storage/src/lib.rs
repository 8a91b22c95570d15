//! PostgreSQL persistence for the payments service: idempotency records, charges, the
//! double-entry ledger and the outbox, and the migrations that create them.
//!
//! Queries are plain `sqlx::query`/`query_as` with `FromRow` rows: the SQL is visible where it
//! runs, and rows are converted to domain and protocol types here, at the edge, so nothing above
//! this crate sees a database type. Each multi-statement step runs in a transaction this crate
//! opens and commits; single statements rely on PostgreSQL's statement atomicity. This crate
//! must not import axum or any HTTP type. Redis (the replay cache, the event stream) is only
//! ever an accelerator and a transport: nothing here treats it as a source of truth.

mod charges;
mod claim;
mod error;
mod finish;
mod ledger;
mod outbox;
mod recovery;
mod redis_link;
mod replay_cache;
mod rows;

use std::time::Duration;

use payments_idempotency::IdempotencyPolicy;
use sqlx::PgPool;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub use charges::{ChargePage, ListCharges};
pub use claim::{Claim, Claimed};
pub use error::StoreError;
pub use finish::Finish;
pub use ledger::Balance;
pub use outbox::{Backlog, EventStream, OutboxEvent, RelayError};
pub use recovery::Abandoned;
pub use redis_link::{RedisFailure, RedisLink};
pub use replay_cache::{CachedReplay, ReplayCache};

/// The migrations under `migrations/postgres`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_connections: u32,
    /// How long a request waits for a connection before it fails with 503: short, so a lost
    /// database fails requests fast instead of queueing them.
    pub acquire_timeout: Duration,
}

/// The repository the service works through. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    policy: IdempotencyPolicy,
}

impl PgStore {
    /// Connects lazily: the service starts even while the database is down, answers 503 until
    /// it is back, and recovers without a restart.
    pub fn connect_lazy(
        options: PgConnectOptions,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Self {
        // No ping before each acquire: it would add a round trip to every statement on the hot
        // path. A connection that died is found by its next statement, which fails as
        // `Unavailable` (503, nothing executed) and is dropped from the pool.
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Self { pool, policy }
    }

    /// Wraps an existing pool (tests, tools).
    pub fn from_pool(pool: PgPool, policy: IdempotencyPolicy) -> Self {
        Self { pool, policy }
    }

    /// Creates the database named in `url` if it does not exist yet.
    pub async fn create_database_if_missing(url: &str) -> Result<(), StoreError> {
        if !sqlx::Postgres::database_exists(url).await? {
            sqlx::Postgres::create_database(url).await?;
        }
        Ok(())
    }

    /// Applies the embedded migrations. Safe to run from several instances at once: sqlx takes
    /// an advisory lock around them.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
    }

    /// Answers whether the database takes a query now.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn policy(&self) -> IdempotencyPolicy {
        self.policy
    }
}

/// Seconds as a PostgreSQL interval argument (`make_interval(secs => $n)` takes a double).
fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}
