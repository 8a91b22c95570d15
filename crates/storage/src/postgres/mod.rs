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

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use payments_idempotency::IdempotencyPolicy;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use crate::{PoolSettings, StoreError};

/// The migrations under `migrations/postgres`, embedded in the binary.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// When a statement last found its database read-only (SQLSTATE 25006: the node it reached was
/// demoted to a standby), in milliseconds on [`CLOCK`]; 0 for never. Every connection opened
/// before then may lead to that node, so each is closed as it comes back to the pool, and the
/// pool opens new ones (which a pooler in front sends to the new primary). Process-wide: one
/// demoted node is reason enough for every pool of the process to reconnect.
static READ_ONLY_SEEN_AT: AtomicU64 = AtomicU64::new(0);

/// The clock of [`READ_ONLY_SEEN_AT`], started with the first pool.
static CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

fn millis_on_clock() -> u64 {
    u64::try_from(CLOCK.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A statement found its database read-only: the connections opened until now leave the pool.
pub(crate) fn saw_read_only() {
    READ_ONLY_SEEN_AT.store(millis_on_clock().max(1), Ordering::Relaxed);
}

/// Whether a connection of this `age` was opened before the last read-only answer (or in the
/// same millisecond).
fn opened_before_read_only(age: Duration) -> bool {
    let seen = READ_ONLY_SEEN_AT.load(Ordering::Relaxed);
    let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
    seen != 0 && millis_on_clock().saturating_sub(age) <= seen
}

/// The PostgreSQL store. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pool: PgPool,
    policy: IdempotencyPolicy,
}

impl PgStore {
    /// Connects lazily: the service starts even while the database is down, answers 503 until
    /// it is back, and recovers without a restart.
    pub(crate) fn connect_lazy(
        options: PgConnectOptions,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Self {
        LazyLock::force(&CLOCK);
        let timeout_ms = settings.statement_timeout.as_millis();
        let options = options.options([("statement_timeout", timeout_ms)]);
        // No ping before each acquire: it would add a round trip to every statement on the hot
        // path. A connection that died is found by its next statement, which fails as
        // `Unavailable` (503, nothing executed) and is dropped from the pool; one that reached
        // a demoted primary is closed as it comes back (`opened_before_read_only`).
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .after_release(|_, connection| {
                let keep = !opened_before_read_only(connection.age);
                Box::pin(async move { Ok(keep) })
            })
            .connect_lazy_with(options);
        Self { pool, policy }
    }

    /// Creates the database named in `url` if it does not exist yet.
    pub(crate) async fn create_database_if_missing(url: &str) -> Result<(), StoreError> {
        if !sqlx::Postgres::database_exists(url).await? {
            sqlx::Postgres::create_database(url).await?;
        }
        Ok(())
    }

    /// Begins a transaction on a task of its own.
    ///
    /// The driver's BEGIN is not cancel-safe: a caller dropped while BEGIN is in flight (its
    /// client hung up, or it timed out) returns the connection to the pool inside a
    /// transaction that nothing will end, and every later statement on that connection runs
    /// in it, uncommitted and holding its locks, until something ends it, possibly with a
    /// rollback. On its own task the BEGIN always completes, and a transaction whose caller is
    /// gone is dropped there, which rolls it back. Once the caller holds the transaction,
    /// dropping it is safe.
    async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let pool = self.pool.clone();
        tokio::spawn(async move { pool.begin().await })
            .await
            .map_err(|_| StoreError::from(sqlx::Error::WorkerCrashed))?
            .map_err(StoreError::from)
    }
}
