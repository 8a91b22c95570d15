//! The idempotency engine's record store on PostgreSQL and SQLite, for any service that keeps
//! its records in one of them: the claim, the takeover of a stale record, the fence on every
//! later write, the completion in the transaction the engine ends a record in, the release,
//! the completer's takeover, the reaper and the table's statistics, as whole SQL statements
//! (each backend's module has its own text, under the same names, in the same order).
//!
//! A service applies the records table (`schema/postgres.sql`, `schema/sqlite.sql`) and opens
//! its backend's store: [`PgRecords`] or [`SqliteRecords`], each the port with its own
//! transaction (`sqlx::Transaction<'static, Postgres>`, [`WriteTx`]), on which its operations
//! write their rows with plain sqlx; or [`SqlRecords`], either of them, for a service that
//! runs on both with the same SQL ([`Transaction::execute`]). Beside the server it runs the
//! records' [`Upkeep`] (the reaper, the table's statistics). A write the database refuses for
//! good (a constraint, a value its column cannot hold) is [`Error::Refused`], which the engine
//! ends a finish on rather than failing every retry. This crate knows no operation's tables,
//! no web framework, no cache, and no crate of the workspace but the engine. A whole service
//! on it is walked through in `docs/build-a-service.md`, with `examples/orders`.

mod commits;
mod error;
pub mod postgres;
mod row;
pub mod sqlite;
mod upkeep;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_idempotency::engine::{
    Abandoned, Begin, Claim, Completion, End, Engine, Finish, Owner, RecordBatches, RecordStore,
    StoreFailure,
};
use payments_idempotency::{
    Fingerprint, IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, Scope, StoredResponse,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{PgConnection, Postgres, SqliteConnection};

pub use commits::{CommitObserver, GroupCommit, GroupCommits};
pub use error::{
    Error, distrusts_connections, is_busy, is_refused, is_unavailable, no_answer, sqlite_code,
};
pub use postgres::PgRecords;
pub use sqlite::{SqliteRecords, WriteTx};
pub use upkeep::{Batches, Upkeep, UpkeepSettings, in_batches};

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_connections: u32,
    /// How long a request waits for a connection (or, on SQLite, for another process's write)
    /// before it fails as unavailable: short, so that a lost database fails requests fast
    /// instead of queueing them.
    pub acquire_timeout: Duration,
    /// PostgreSQL cancels a statement that runs longer (`statement_timeout`), so that a lock
    /// held forever or a node too loaded to answer fails a request as unavailable instead of
    /// holding it to its timeout.
    pub statement_timeout: Duration,
    /// PostgreSQL cancels a statement that waits longer for a row (or table) another
    /// transaction holds (`lock_timeout`): the call fails as busy ([`Error::Busy`]), and only
    /// the requests that need that row wait for it. Shorter than `statement_timeout`, or a held
    /// row is told apart from a database that does not answer only by the latter's margin.
    pub lock_timeout: Duration,
    /// PostgreSQL ends a session that stays this long inside a transaction without sending a
    /// statement (`idle_in_transaction_session_timeout`), rolling the transaction back: an
    /// instance frozen or cut off mid-transaction holds its rows for this long at most, and
    /// the fence refuses whatever it writes later. Longer than any wait between two statements
    /// of one transaction (the outbox relay's publish, on PostgreSQL).
    pub idle_in_transaction_timeout: Duration,
}

/// Where the records live, parsed from a database URL.
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

/// The backend a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
        }
    }
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

    /// Opens the records. PostgreSQL's database is created if missing and its pool connects
    /// lazily afterwards; SQLite's file and directory are created if missing. The schema is
    /// the service's to apply (its migrations, or [`SqlRecords::create_schema`]).
    pub async fn open(
        &self,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Result<SqlRecords, Error> {
        Ok(match self {
            Self::Postgres { url, .. } => PgRecords::open(url, settings, policy).await?.into(),
            Self::Sqlite(options) => SqliteRecords::open(options.clone(), settings, policy)
                .await?
                .into(),
        })
    }
}

fn is_in_memory(options: &SqliteConnectOptions) -> bool {
    options
        .get_filename()
        .to_string_lossy()
        .starts_with("file:sqlx-in-memory")
}

/// The idempotency records of a database, on either backend: for a service that runs on
/// both with the same SQL ([`Transaction::execute`]). A service on one backend takes that
/// backend's store ([`PgRecords`], [`SqliteRecords`]) and its own transaction. Cheap to clone.
#[derive(Debug, Clone)]
pub enum SqlRecords {
    Postgres(PgRecords),
    Sqlite(SqliteRecords),
}

impl From<PgRecords> for SqlRecords {
    fn from(records: PgRecords) -> Self {
        Self::Postgres(records)
    }
}

impl From<SqliteRecords> for SqlRecords {
    fn from(records: SqliteRecords) -> Self {
        Self::Sqlite(records)
    }
}

/// A write transaction begun over one idempotency record, which it holds until it ends: the
/// engine begins it, the operation writes its rows in it ([`Transaction::connection`]), the
/// engine ends the record in it and commits. Dropped uncommitted, it is rolled back.
#[derive(Debug)]
pub enum Transaction {
    Postgres(sqlx::Transaction<'static, Postgres>),
    /// SQLite's in-process write gate and its `BEGIN IMMEDIATE` transaction.
    Sqlite(WriteTx),
}

impl From<sqlx::Transaction<'static, Postgres>> for Transaction {
    fn from(tx: sqlx::Transaction<'static, Postgres>) -> Self {
        Self::Postgres(tx)
    }
}

impl From<WriteTx> for Transaction {
    fn from(write: WriteTx) -> Self {
        Self::Sqlite(write)
    }
}

/// The connection of a [`Transaction`], on which an operation writes its rows.
#[derive(Debug)]
pub enum Connection<'a> {
    Postgres(&'a mut PgConnection),
    Sqlite(&'a mut SqliteConnection),
}

impl Transaction {
    pub fn connection(&mut self) -> Connection<'_> {
        match self {
            Self::Postgres(tx) => Connection::Postgres(tx),
            Self::Sqlite(write) => Connection::Sqlite(write),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// Runs one statement written once for both backends, with its values bound through
    /// sqlx's `Any` driver and handed to this transaction's backend as its own:
    ///
    /// ```ignore
    /// transaction.execute(sqlx::query(INSERT_ORDER).bind(&id).bind(quantity)).await?;
    /// ```
    ///
    /// The values may be text, bytes, integers, floats and booleans (what `Any` binds).
    /// Returns how many rows the statement changed; an error is judged as the store's own
    /// ([`Error`]: unavailable, busy, refused for good).
    pub async fn execute<'q>(
        &mut self,
        mut query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    ) -> Result<u64, Error> {
        use sqlx::Execute;
        let unencodable = |e| Error::Database(sqlx::Error::Encode(e));
        let sql = query.sql();
        let values = query.take_arguments().map_err(unencodable)?;
        let values = values.unwrap_or_default();
        let done = match self {
            Self::Postgres(tx) => {
                let values: sqlx::postgres::PgArguments =
                    values.convert_to().map_err(unencodable)?;
                postgres::answered(sqlx::query_with(sql, values).execute(&mut **tx))
                    .await?
                    .rows_affected()
            }
            Self::Sqlite(write) => {
                let values: sqlx::sqlite::SqliteArguments<'_> =
                    values.convert_to().map_err(unencodable)?;
                sqlx::query_with(sql, values)
                    .execute(&mut **write)
                    .await?
                    .rows_affected()
            }
        };
        Ok(done)
    }

    /// Commits (the engine commits the transactions it begins through `RecordStore::commit`;
    /// this is for a service's own, from [`SqlRecords::begin_write`]).
    pub async fn commit(self) -> Result<(), Error> {
        match self {
            Self::Postgres(tx) => postgres::answered(tx.commit()).await?,
            Self::Sqlite(write) => write.commit().await?,
        }
        Ok(())
    }
}

/// A claim of `key` for a request: its scope, its fingerprint, and the canonical body stored
/// with the record for the completer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewClaim<'a> {
    pub(crate) scope: &'a Scope,
    pub(crate) key: &'a IdempotencyKey,
    pub(crate) fingerprint: &'a Fingerprint,
    pub(crate) request_body: &'a [u8],
}

impl SqlRecords {
    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// Whether writing finishes in batches pays on this store, so that a service gives it to
    /// its engine as such (`Engine::with_batches`): on PostgreSQL, where a batch's records are
    /// completed by one statement and committed once; not on SQLite, whose writes already
    /// share their commits, every one of them ([`sqlite`]).
    pub fn writes_batches(&self) -> bool {
        self.backend() == Backend::Postgres
    }

    /// An engine over these records, given them as batches too where batches pay
    /// ([`writes_batches`](Self::writes_batches)).
    pub fn engine(&self) -> Engine<Transaction> {
        let records = Arc::new(self.clone());
        if self.writes_batches() {
            Engine::new(Arc::clone(&records) as _).with_batches(records)
        } else {
            Engine::new(records)
        }
    }

    pub fn policy(&self) -> IdempotencyPolicy {
        match self {
            Self::Postgres(records) => records.policy(),
            Self::Sqlite(records) => records.policy(),
        }
    }

    /// Shows every later group commit of this process's writes to `observer`, just before it
    /// is made: on SQLite every write's, on PostgreSQL the statements of claims.
    pub fn observe_commits(&self, observer: std::sync::Arc<dyn CommitObserver>) {
        match self {
            Self::Postgres(records) => records.observe_commits(observer),
            Self::Sqlite(records) => records.observe_commits(observer),
        }
    }

    /// The group commits of this process's writes so far: on SQLite every write's, on
    /// PostgreSQL the statements of claims.
    pub fn group_commits(&self) -> GroupCommits {
        match self {
            Self::Postgres(records) => records.group_commits(),
            Self::Sqlite(records) => records.group_commits(),
        }
    }

    /// Creates the records table and its indexes where they are missing, for a service
    /// without migrations of its own (one with migrations copies `schema/<backend>.sql`).
    pub async fn create_schema(&self) -> Result<(), Error> {
        match self {
            Self::Postgres(records) => records.create_schema().await,
            Self::Sqlite(records) => records.create_schema().await,
        }
    }

    /// Begins a write transaction over no record, for a service's own writes (on SQLite it
    /// queues behind this process's other writers, as the engine's transactions do).
    pub async fn begin_write(&self) -> Result<Transaction, Error> {
        Ok(match self {
            Self::Postgres(records) => Transaction::Postgres(records.begin_transaction().await?),
            Self::Sqlite(records) => Transaction::Sqlite(records.begin_write().await?),
        })
    }

    /// Deletes up to `batch` expired records, the longest expired first, and returns how many.
    ///
    /// Pending records are never reaped, however old: the effect may have been made, and only
    /// a resume or the completer may settle them. Nor is a failed record that holds an effect
    /// id. A completed record holding an effect id was completed in the transaction that
    /// wrote its effect's rows (a completion without an effect matches no record that holds
    /// one), so the reaper judges a record by the record alone.
    pub async fn reap_expired(&self, batch: i64) -> Result<u64, Error> {
        match self {
            Self::Postgres(records) => records.reap_expired(batch).await,
            Self::Sqlite(records) => records.reap_expired(batch).await,
        }
    }

    /// Analyzes the records table if it changed so much since it was last analyzed that the
    /// plans made over its statistics may scan it (on PostgreSQL: more rows changed than that
    /// analyze counted, and at least 1,000); returns whether it did. A worker calls it every
    /// second, so that a new database's plans follow its growth. A role that may not analyze
    /// the table (not its owner) leaves it to autovacuum. On SQLite it does nothing:
    /// SQLite plans a lookup by key along the key's index whatever the table holds.
    pub async fn refresh_statistics(&self) -> Result<bool, Error> {
        match self {
            Self::Postgres(records) => records.refresh_statistics().await,
            Self::Sqlite(_) => Ok(false),
        }
    }

    /// Takes over the pending record that holds `effect_key`, once its lock has ended: a
    /// reconciler found the effect at its maker and settles the record now, without the
    /// completer's grace (no call under the key can still be on its way to make it).
    pub async fn take_over_by_effect_key(&self, effect_key: &str) -> Result<PendingEffect, Error> {
        match self {
            Self::Postgres(records) => records.take_over_by_effect_key(effect_key).await,
            Self::Sqlite(records) => records.take_over_by_effect_key(effect_key).await,
        }
    }

    /// Completes, in `transaction`, the pending record under `key` that no attempt will ever
    /// finish (an operator voided its effect) with `response`, whichever attempt holds it; the
    /// attempt number moves on, so an attempt still at work is fenced off. A record holding an
    /// effect id is left alone. Returns how many records it completed (0 or 1).
    pub async fn complete_held(
        &self,
        transaction: &mut Transaction,
        scope: &Scope,
        key: &IdempotencyKey,
        response: &StoredResponse,
    ) -> Result<u64, Error> {
        match (self, transaction) {
            (Self::Postgres(records), Transaction::Postgres(tx)) => {
                records.complete_held(tx, scope, key, response).await
            }
            (Self::Sqlite(records), Transaction::Sqlite(write)) => {
                records.complete_held(write, scope, key, response).await
            }
            _ => Err(of_another_backend()),
        }
    }
}

/// What a reconciler finds of the pending record an effect key belongs to.
#[derive(Debug, Clone)]
pub enum PendingEffect {
    /// Its lock had ended: taken over, to be settled now.
    TakenOver(Abandoned),
    /// It is pending under a live lock: its attempt is at work.
    InFlight,
    /// No pending record holds the key.
    None,
}

impl PendingEffect {
    fn in_flight_if(pending: bool) -> Self {
        if pending { Self::InFlight } else { Self::None }
    }
}

/// A transaction of the other backend than the store's: never made by a service that opens
/// one store.
fn of_another_backend() -> Error {
    Error::Corrupt("a transaction of another backend's store".to_owned())
}

/// The port on either backend: each call is the backend's store's own
/// ([`PgRecords`], [`SqliteRecords`]), its transaction wrapped as this one.
#[async_trait]
impl RecordStore for SqlRecords {
    type Transaction = Transaction;

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreFailure> {
        match self {
            Self::Postgres(records) => {
                RecordStore::claim(records, scope, key, fingerprint, request_body).await
            }
            Self::Sqlite(records) => {
                RecordStore::claim(records, scope, key, fingerprint, request_body).await
            }
        }
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreFailure> {
        match self {
            Self::Postgres(records) => RecordStore::find_record(records, scope, key).await,
            Self::Sqlite(records) => RecordStore::find_record(records, scope, key).await,
        }
    }

    async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, StoreFailure> {
        match self {
            Self::Postgres(records) => RecordStore::record_effect(records, owner, effect_id).await,
            Self::Sqlite(records) => RecordStore::record_effect(records, owner, effect_id).await,
        }
    }

    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreFailure> {
        match self {
            Self::Postgres(records) => RecordStore::release(records, owner).await,
            Self::Sqlite(records) => RecordStore::release(records, owner).await,
        }
    }

    async fn begin(
        &self,
        owner: Owner<'_>,
        begin: Begin,
    ) -> Result<Option<Transaction>, StoreFailure> {
        Ok(match self {
            Self::Postgres(records) => RecordStore::begin(records, owner, begin)
                .await?
                .map(Transaction::Postgres),
            Self::Sqlite(records) => RecordStore::begin(records, owner, begin)
                .await?
                .map(Transaction::Sqlite),
        })
    }

    async fn end(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreFailure> {
        match (self, transaction) {
            (Self::Postgres(records), Transaction::Postgres(tx)) => {
                RecordStore::end(records, tx, owner, end).await
            }
            (Self::Sqlite(records), Transaction::Sqlite(write)) => {
                RecordStore::end(records, write, owner, end).await
            }
            _ => Err(of_another_backend().into()),
        }
    }

    async fn commit(&self, transaction: Transaction) -> Result<(), StoreFailure> {
        Ok(transaction.commit().await?)
    }

    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure> {
        match self {
            Self::Postgres(records) => {
                RecordStore::take_over_abandoned(records, settle_after).await
            }
            Self::Sqlite(records) => RecordStore::take_over_abandoned(records, settle_after).await,
        }
    }
}

/// Each backend's batches ([`PgRecords`]: one statement completes a batch's records;
/// [`SqliteRecords`]: one write of the process's writer).
#[async_trait]
impl RecordBatches for SqlRecords {
    async fn begin_batch(&self) -> Result<Transaction, StoreFailure> {
        Ok(match self {
            Self::Postgres(records) => Transaction::Postgres(records.begin_batch().await?),
            Self::Sqlite(records) => Transaction::Sqlite(records.begin_write().await?),
        })
    }

    async fn complete_many(
        &self,
        transaction: &mut Transaction,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> Result<Vec<Completion>, StoreFailure> {
        match (self, transaction) {
            (Self::Postgres(store), Transaction::Postgres(tx)) => {
                RecordBatches::complete_many(store, tx, records).await
            }
            (Self::Sqlite(store), Transaction::Sqlite(write)) => {
                RecordBatches::complete_many(store, write, records).await
            }
            _ => Err(of_another_backend().into()),
        }
    }
}
