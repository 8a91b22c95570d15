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

/// When the service last had reason to distrust every open connection, in milliseconds on
/// [`CLOCK`]; 0 for never. Two reasons: a statement found its database read-only (SQLSTATE
/// 25006: the node it reached was demoted to a standby), or a statement got no answer within
/// [`answer_bound`] (the node is frozen, or gone without a word). Every connection opened
/// before then may lead to that node, so each is closed as it comes back to the pool, and the
/// pool opens new ones (which a pooler in front sends to the new primary). Process-wide: one
/// such node is reason enough for every pool of the process to reconnect.
static DISTRUSTED_AT: AtomicU64 = AtomicU64::new(0);

/// The clock of [`DISTRUSTED_AT`], started with the first pool.
static CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

/// The longest a statement, `BEGIN` or `COMMIT` waits for PostgreSQL's answer, in
/// milliseconds (0: no pool yet). The server cancels a slow statement itself at its
/// `statement_timeout`; this bound is for a server that answers nothing at all (a stopped
/// process, a paused machine, a network that drops every packet), where that timeout never
/// runs and TCP keepalives are answered by a kernel that is still alive. The largest of the
/// process's pools, so that no pool's statements are cut short of their own timeout.
static ANSWER_BOUND_MS: AtomicU64 = AtomicU64::new(0);

/// How much longer than `statement_timeout` the service waits before it gives a statement up:
/// a server that runs cancels it first, and its answer says why.
const ANSWER_MARGIN: Duration = Duration::from_secs(1);

fn millis_on_clock() -> u64 {
    u64::try_from(CLOCK.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The connections opened until now leave the pool as they come back to it.
pub(crate) fn distrust_open_connections() {
    DISTRUSTED_AT.store(millis_on_clock().max(1), Ordering::Relaxed);
}

/// Whether a connection of this `age` was opened before the last reason to distrust it (or in
/// the same millisecond).
fn opened_before_distrust(age: Duration) -> bool {
    let seen = DISTRUSTED_AT.load(Ordering::Relaxed);
    let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
    seen != 0 && millis_on_clock().saturating_sub(age) <= seen
}

/// See [`ANSWER_BOUND_MS`].
pub(crate) fn answer_bound() -> Option<Duration> {
    match ANSWER_BOUND_MS.load(Ordering::Relaxed) {
        0 => None,
        millis => Some(Duration::from_millis(millis)),
    }
}

/// The PostgreSQL store. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pool: PgPool,
    policy: IdempotencyPolicy,
    /// How long a `BEGIN` may take: a connection from the pool, then the statement's answer.
    begin_bound: Duration,
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
        let bound = settings.statement_timeout + ANSWER_MARGIN;
        ANSWER_BOUND_MS.fetch_max(
            u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        // No ping before each acquire: it would add a round trip to every statement on the hot
        // path. A connection that died is found by its next statement, which fails as
        // `Unavailable` (503, nothing executed) and is dropped from the pool; one that reached
        // a demoted primary, or that went unanswered, is closed as it comes back
        // (`opened_before_distrust`).
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .after_release(|_, connection| {
                let keep = !opened_before_distrust(connection.age);
                Box::pin(async move { Ok(keep) })
            })
            .connect_lazy_with(options);
        Self {
            pool,
            policy,
            begin_bound: settings.acquire_timeout + bound,
        }
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
        let begun = tokio::spawn(async move { pool.begin().await });
        let begun = tokio::time::timeout(self.begin_bound, begun)
            .await
            .map_err(|_| StoreError::from(crate::dialect::no_answer(self.begin_bound)))?;
        begun
            .map_err(|_| StoreError::from(sqlx::Error::WorkerCrashed))?
            .map_err(StoreError::from)
    }
}
