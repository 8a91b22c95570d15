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

use std::path::Path;
use std::sync::Arc;

use payments_idempotency::IdempotencyPolicy;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::{PoolSettings, StoreError};

/// The migrations under `migrations/sqlite`, embedded in the binary.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// The SQLite store. Cheap to clone (the pool and the write gate are shared).
#[derive(Debug, Clone)]
pub(crate) struct SqliteStore {
    pool: SqlitePool,
    policy: IdempotencyPolicy,
    write_gate: Arc<Mutex<()>>,
}

/// A write transaction: the in-process gate, then SQLite's write lock.
pub(crate) struct WriteTx {
    tx: Transaction<'static, Sqlite>,
    _gate: OwnedMutexGuard<()>,
}

impl std::ops::Deref for WriteTx {
    type Target = sqlx::SqliteConnection;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl WriteTx {
    /// Commits and, by consuming the transaction, also releases the gate.
    async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await?;
        Ok(())
    }
}

impl SqliteStore {
    /// Opens (creating the file and its directory if missing) and checks the database now, so
    /// that an unusable path stops start-up instead of failing the first request.
    pub(crate) async fn open(
        options: SqliteConnectOptions,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Result<Self, StoreError> {
        let in_memory = crate::is_in_memory(&options);
        if !in_memory {
            create_parent_directory(options.get_filename())?;
            owner_only(options.get_filename())?;
        }
        let options = options
            .create_if_missing(true)
            // WAL lets readers go on while one writer writes; FULL makes each commit durable
            // before the client hears of it, as PostgreSQL does.
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            // Another process's write transaction is waited for, not failed at once.
            .busy_timeout(settings.acquire_timeout);
        let mut pool = SqlitePoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout);
        if in_memory {
            // An in-memory database lives as long as one connection to it does.
            pool = pool
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let pool = pool.connect_with(options).await?;
        Ok(Self::from_pool(pool, policy))
    }

    fn from_pool(pool: SqlitePool, policy: IdempotencyPolicy) -> Self {
        Self {
            pool,
            policy,
            write_gate: Arc::new(Mutex::new(())),
        }
    }

    /// Begins a write transaction that holds the write lock from its first statement on.
    pub(crate) async fn begin_immediate(&self) -> Result<WriteTx, StoreError> {
        let gate = Arc::clone(&self.write_gate).lock_owned().await;
        // The SQLite driver's custom BEGIN is not cancel-safe: a request dropped while it runs
        // (its client went away, or it timed out) can leave the connection inside a transaction
        // that nothing will roll back, holding the write lock for good. On a task of its own
        // the BEGIN always finishes, and a transaction whose caller is gone is dropped there,
        // which rolls it back. Once the caller holds the transaction, dropping it is safe.
        let pool = self.pool.clone();
        let tx = tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await })
            .await
            .map_err(|_| StoreError::from(sqlx::Error::WorkerCrashed))??;
        Ok(WriteTx { tx, _gate: gate })
    }
}

fn create_parent_directory(file: &Path) -> Result<(), StoreError> {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Unusable(format!("cannot create directory {}: {e}", dir.display()))
        }),
        _ => Ok(()),
    }
}

/// Creates the database file readable and writable by its owner only (0600), or narrows an
/// existing one to that: it holds stored responses and request bodies. SQLite gives the `-wal`
/// and `-shm` files the permissions of the database file; existing ones are narrowed too.
#[cfg(unix)]
fn owner_only(file: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    const OWNER_ONLY: u32 = 0o600;
    let unusable = |path: &Path, e: std::io::Error| {
        StoreError::Unusable(format!(
            "cannot restrict {} to its owner: {e}",
            path.display()
        ))
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(OWNER_ONLY)
        .open(file)
        .map_err(|e| unusable(file, e))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut path = file.as_os_str().to_owned();
        path.push(suffix);
        let path = Path::new(&path);
        let Ok(metadata) = std::fs::metadata(path) else {
            continue;
        };
        if metadata.permissions().mode() & 0o077 != 0 {
            tracing::warn!(file = %path.display(), "narrowing the database file's permissions to 0600");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(OWNER_ONLY))
                .map_err(|e| unusable(path, e))?;
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn owner_only(_file: &Path) -> Result<(), StoreError> {
    Ok(())
}
