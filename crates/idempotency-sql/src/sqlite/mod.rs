//! The record store on SQLite, the embedded backend: one file (or memory) and no server.
//!
//! SQLite has one writer at a time and no row locks, so the guarantees are kept differently
//! from PostgreSQL, with the same outcomes:
//! - every write runs in a `BEGIN IMMEDIATE` transaction, which takes the database's write
//!   lock before its first read: two claims of one key cannot both see it free or stale,
//!   whether they come from one process or several, and the transaction the engine ends a
//!   record in holds the whole database until it ends;
//! - inside one process, writers also queue on an async mutex first, so that they wait their
//!   turn in order instead of spinning in SQLite's busy handler, and the claims and the
//!   records' transactions of concurrent requests share one commit (`batch.rs`: a group
//!   commit, each writer under a savepoint of its own). A service writes its own rows through
//!   the same gate, alone ([`SqliteRecords::begin_write`]);
//! - the clock is SQLite's (`strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`), so lock expiry is judged
//!   the same way by every process on the file.
//!
//! The statements are in `statements.rs`: PostgreSQL's, in the same order under the same
//! names, with SQLite's clock and without its row locks.

mod batch;
mod file;
mod statements;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_idempotency::engine::{
    Abandoned, Begin, Claim, Claimed, Completion, End, Engine, Finish, Owner, RecordBatches,
    RecordStore, StoreFailure, Unmade, Verdict, complete_each,
};
use payments_idempotency::{
    Fingerprint, IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, Scope, StoredResponse,
};
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection};

use batch::WriteGate;
pub use batch::{Sharing, WriteTx, WritesLocked};
use file::{create_parent_directory, owner_only};
use statements::*;

use crate::commits::{CommitObserver, GroupCommits};
use crate::error::Error;
use crate::row::{
    AbandonedRow, Generation, RecordWithClock, ResponseColumns, TakenOver, request_version,
};
use crate::{NewClaim, PendingEffect, PoolSettings};

/// The records table, as a service applies it.
pub const SCHEMA: &str = include_str!("../../schema/sqlite.sql");

/// The records of an SQLite database. Cheap to clone (the pool and the write gate are shared).
#[derive(Debug, Clone)]
pub struct SqliteRecords {
    pool: SqlitePool,
    policy: IdempotencyPolicy,
    writes: WriteGate,
}

impl SqliteRecords {
    /// Opens (creating the file and its directory if missing, readable by its owner only) and
    /// checks the database now, so that an unusable path stops start-up instead of failing
    /// the first request.
    pub async fn open(
        options: SqliteConnectOptions,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Result<Self, Error> {
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
            .acquire_timeout(settings.acquire_timeout)
            // A connection to a file cannot be cut off the way a socket can, and the driver's
            // ping before each acquire costs a round trip to the connection's thread.
            .test_before_acquire(false);
        if in_memory {
            // An in-memory database lives as long as one connection to it does.
            pool = pool
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let pool = pool.connect_with(options).await?;
        Ok(Self {
            writes: WriteGate::new(pool.clone()),
            pool,
            policy,
        })
    }

    /// An engine over these records, without batches: SQLite's writes already share their
    /// commits, every one of them.
    pub fn engine(&self) -> Engine<WriteTx> {
        Engine::new(Arc::new(self.clone()))
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub fn policy(&self) -> IdempotencyPolicy {
        self.policy
    }

    /// Waits for this process's other writers, then holds the gate (migrations, which write
    /// outside a transaction of this store's).
    pub async fn lock_writes(&self) -> WritesLocked {
        self.writes.lock().await
    }

    /// Begins a write transaction of its own, which holds the write lock from its first
    /// statement on (a service's own writes).
    pub async fn begin_write(&self) -> Result<WriteTx, Error> {
        self.writes.begin(Sharing::Alone).await
    }

    /// The commits of this process's writes so far, and how many writes they held.
    pub fn group_commits(&self) -> GroupCommits {
        self.writes.group_commits()
    }

    /// Shows every later commit of this process's writes to `observer`, just before it is
    /// made; the first observer set stays.
    pub fn observe_commits(&self, observer: Arc<dyn CommitObserver>) {
        self.writes.observe(observer);
    }

    pub(crate) async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, Error> {
        let mut connection = self.pool.acquire().await?;
        read(&mut connection, scope, key)
            .await?
            .map(RecordWithClock::into_record)
            .transpose()
    }

    /// The claim. Most requests that find a record are answered from it (a replay, a 409
    /// while another attempt holds the lock, a 422 for another payload), and those need no
    /// write, so the claim first reads the record outside the write lock and answers from that
    /// read. Only a key that is new, or whose record must be taken over or replaced, goes on to
    /// the claim under the write lock, which decides again: what the read saw may have changed
    /// since.
    pub(crate) async fn claim(&self, claim: NewClaim<'_>) -> Result<Claim, Error> {
        if let Some((record, now)) = self.find_record(claim.scope, claim.key).await?
            && let Verdict::Answer(answer) = Verdict::of(&record, claim.fingerprint, now)
        {
            return Ok(answer);
        }
        self.claim_exclusive(claim).await
    }

    /// The insert, the read and the decision run in one write transaction: the write lock is
    /// held from the first statement, so no other claim can interleave. The claim shares its
    /// commit with concurrent writers', and is made again alone if that commit fails.
    async fn claim_exclusive(&self, claim: NewClaim<'_>) -> Result<Claim, Error> {
        match self.claim_in(claim, Sharing::Shared).await {
            Err(Error::BatchFailed(_)) => self.claim_in(claim, Sharing::Alone).await,
            claimed => claimed,
        }
    }

    async fn claim_in(&self, claim: NewClaim<'_>, sharing: Sharing) -> Result<Claim, Error> {
        let mut write = self.writes.begin(sharing).await?;
        let insert = write.opening(INSERT_PENDING);
        let inserted = self.insert_pending(&mut write, &insert, &claim).await?;
        write.opened();
        if let Some(claimed) = inserted {
            write.commit().await?;
            return Ok(Claim::Owned(claimed));
        }
        let corrupt = |what: &str| Error::Corrupt(format!("key {} {what}", claim.key));
        let found = read(&mut write, claim.scope, claim.key)
            .await?
            .ok_or_else(|| corrupt("neither inserts nor reads back"))?;
        let (record, now) = found.into_record()?;
        let outcome = match Verdict::of(&record, claim.fingerprint, now) {
            Verdict::Answer(answer) => answer,
            Verdict::Resume(from) => {
                let taken: TakenOver = sqlx::query_as(TAKE_OVER)
                    .bind(claim.scope.tenant.as_str())
                    .bind(claim.scope.operation.as_str())
                    .bind(claim.key.as_str())
                    .bind(after(self.policy.lock_timeout))
                    .fetch_one(&mut *write)
                    .await?;
                Claim::Owned(taken.claimed(from, record.effect_id))
            }
            Verdict::Replace => {
                let new = Generation::new();
                let (attempts,): (i32,) = new_generation(REPLACE, claim, self.policy, &new)
                    .fetch_one(&mut *write)
                    .await?;
                Claim::Owned(new.replacing(attempts))
            }
            // Under the write lock the record read just now cannot be absent.
            Verdict::Absent => return Err(corrupt("exists but was judged absent")),
        };
        write.commit().await?;
        Ok(outcome)
    }

    /// `INSERT_PENDING`, as `statement` gives it (the writer's first statement).
    async fn insert_pending(
        &self,
        connection: &mut SqliteConnection,
        statement: &str,
        claim: &NewClaim<'_>,
    ) -> Result<Option<Claimed>, Error> {
        let new = Generation::new();
        let inserted: Option<(i32,)> = new_generation(statement, *claim, self.policy, &new)
            .fetch_optional(connection)
            .await?;
        Ok(inserted.map(|(attempts,)| new.claimed(attempts)))
    }

    pub(crate) async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, Error> {
        let mut write = self.begin_write().await?;
        let done = fenced(RECORD_EFFECT, owner)
            .bind(effect_id)
            .execute(&mut *write)
            .await?;
        write.commit().await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    pub(crate) async fn release(&self, owner: Owner<'_>) -> Result<Finish, Error> {
        let mut write = self.begin_write().await?;
        let done = fenced(RELEASE, owner).execute(&mut *write).await?;
        write.commit().await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Begins the transaction a record ends in, shared with concurrent writers' (`Shared`)
    /// or `Alone`, once the record is locked by its owner.
    pub(crate) async fn begin(
        &self,
        owner: Owner<'_>,
        sharing: Sharing,
    ) -> Result<Option<WriteTx>, Error> {
        let mut write = self.writes.begin(sharing).await?;
        let lock = write.opening(LOCK);
        let locked: Option<(i32,)> = fenced_as(&lock, owner).fetch_optional(&mut *write).await?;
        write.opened();
        // Not found: dropped, the transaction is rolled back having written nothing.
        Ok(locked.map(|_| write.over_record()))
    }

    pub(crate) async fn end(
        &self,
        write: &mut SqliteConnection,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, Error> {
        let ttl = after(self.policy.ttl);
        let expires_at: Option<(DateTime<Utc>,)> = match end {
            End::Made(response) | End::Unmade(Unmade::Answered(response)) => {
                let statement = match end {
                    End::Made(_) => COMPLETE,
                    _ => COMPLETE_WITHOUT_EFFECT,
                };
                let columns = ResponseColumns::of(response)?;
                fenced_as(statement, owner)
                    .bind(columns.status)
                    .bind(columns.headers)
                    .bind(columns.body)
                    .bind(columns.schema_version)
                    .bind(ttl)
                    .fetch_optional(&mut *write)
                    .await?
            }
            End::Unmade(Unmade::Tombstoned) => {
                fenced_as(FAIL, owner)
                    .bind(ttl)
                    .fetch_optional(&mut *write)
                    .await?
            }
            End::Unrecorded {
                effect_id,
                response,
            } => {
                let columns = ResponseColumns::of(response)?;
                fenced_as(COMPLETE_UNRECORDED, owner)
                    .bind(columns.status)
                    .bind(columns.headers)
                    .bind(columns.body)
                    .bind(columns.schema_version)
                    .bind(ttl)
                    .bind(effect_id)
                    .fetch_optional(&mut *write)
                    .await?
            }
        };
        Ok(Completion::from_expiry(expires_at.map(|(at,)| at)))
    }

    pub(crate) async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, Error> {
        let mut write = self.begin_write().await?;
        let row: Option<AbandonedRow> = sqlx::query_as(TAKE_OVER_ABANDONED)
            .bind(after(self.policy.lock_timeout))
            .bind(ago(settle_after))
            .fetch_optional(&mut *write)
            .await?;
        write.commit().await?;
        row.map(AbandonedRow::into_abandoned).transpose()
    }

    pub(crate) async fn take_over_by_effect_key(
        &self,
        effect_key: &str,
    ) -> Result<PendingEffect, Error> {
        let mut write = self.begin_write().await?;
        let row: Option<AbandonedRow> = sqlx::query_as(TAKE_OVER_BY_EFFECT_KEY)
            .bind(after(self.policy.lock_timeout))
            .bind(effect_key)
            .fetch_optional(&mut *write)
            .await?;
        let (pending,): (i64,) = sqlx::query_as(COUNT_PENDING_BY_EFFECT_KEY)
            .bind(effect_key)
            .fetch_one(&mut *write)
            .await?;
        write.commit().await?;
        match row {
            Some(row) => Ok(PendingEffect::TakenOver(row.into_abandoned()?)),
            None => Ok(PendingEffect::in_flight_if(pending > 0)),
        }
    }

    pub(crate) async fn complete_held(
        &self,
        write: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        response: &StoredResponse,
    ) -> Result<u64, Error> {
        let columns = ResponseColumns::of(response)?;
        let done = sqlx::query(COMPLETE_HELD)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(key.as_str())
            .bind(columns.status)
            .bind(columns.headers)
            .bind(columns.body)
            .bind(columns.schema_version)
            .bind(after(self.policy.ttl))
            .execute(write)
            .await?;
        Ok(done.rows_affected())
    }

    /// One batch per write transaction keeps a request waiting for one batch at most.
    pub async fn reap_expired(&self, batch: i64) -> Result<u64, Error> {
        let mut write = self.begin_write().await?;
        let done = sqlx::query(REAP_EXPIRED)
            .bind(batch)
            .execute(&mut *write)
            .await?;
        write.commit().await?;
        Ok(done.rows_affected())
    }

    /// Creates the records table and its indexes if they are missing (`schema/sqlite.sql`).
    pub async fn create_schema(&self) -> Result<(), Error> {
        let _gate = self.writes.lock().await;
        sqlx::raw_sql(SCHEMA).execute(&self.pool).await?;
        Ok(())
    }
}

async fn read(
    connection: &mut SqliteConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<RecordWithClock>, Error> {
    Ok(sqlx::query_as(READ)
        .bind(scope.tenant.as_str())
        .bind(scope.operation.as_str())
        .bind(key.as_str())
        .fetch_optional(connection)
        .await?)
}

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>;
type QueryAs<'q, R> = sqlx::query::QueryAs<'q, Sqlite, R, SqliteArguments<'q>>;

/// A new generation's record (`INSERT_PENDING`, `REPLACE`) with its ten values bound as `?1`
/// to `?10`: the claim, the lock timeout, the generation and its effect key, the retention.
fn new_generation<'q>(
    statement: &'q str,
    claim: NewClaim<'q>,
    policy: IdempotencyPolicy,
    new: &'q Generation,
) -> QueryAs<'q, (i32,)> {
    sqlx::query_as(statement)
        .bind(claim.scope.tenant.as_str())
        .bind(claim.scope.operation.as_str())
        .bind(claim.key.as_str())
        .bind(claim.fingerprint.as_bytes().as_slice())
        .bind(request_version(claim.fingerprint))
        .bind(after(policy.lock_timeout))
        .bind(new.id)
        .bind(new.effect_key.as_str())
        .bind(after(policy.ttl))
        .bind(claim.request_body)
}

/// A fenced statement with the owner's five values bound as `?1` to `?5`.
fn fenced<'q>(statement: &'q str, owner: Owner<'q>) -> Query<'q> {
    sqlx::query(statement)
        .bind(owner.scope.tenant.as_str())
        .bind(owner.scope.operation.as_str())
        .bind(owner.key.as_str())
        .bind(owner.fence.attempt.0)
        .bind(owner.fence.generation)
}

/// [`fenced`], reading rows back.
fn fenced_as<'q, R>(statement: &'q str, owner: Owner<'q>) -> QueryAs<'q, R>
where
    R: for<'r> sqlx::FromRow<'r, SqliteRow>,
{
    sqlx::query_as(statement)
        .bind(owner.scope.tenant.as_str())
        .bind(owner.scope.operation.as_str())
        .bind(owner.key.as_str())
        .bind(owner.fence.attempt.0)
        .bind(owner.fence.generation)
}

/// The modifier of `strftime(.., 'now', ?)` for a time `duration` from now.
fn after(duration: Duration) -> String {
    format!("+{:.3} seconds", duration.as_secs_f64())
}

/// The modifier for a time `duration` before now.
fn ago(duration: Duration) -> String {
    format!("-{:.3} seconds", duration.as_secs_f64())
}

/// The port on SQLite, in its own transaction ([`WriteTx`], a connection of the process's one
/// writer): a service on this store alone writes its rows in its `finish` with plain sqlx
/// (`query.execute(&mut **transaction)`). A transaction shares its commit with the concurrent
/// writers' unless begun [`alone`](Begin::alone); one that ends a record locks it first, as
/// any other. Each method is the store's own (inherent, with its [`Error`]), seen through the
/// port.
#[async_trait]
impl RecordStore for SqliteRecords {
    type Transaction = WriteTx;

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreFailure> {
        let claim = NewClaim {
            scope,
            key,
            fingerprint,
            request_body,
        };
        Ok(SqliteRecords::claim(self, claim).await?)
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreFailure> {
        Ok(SqliteRecords::find_record(self, scope, key).await?)
    }

    async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, StoreFailure> {
        Ok(SqliteRecords::record_effect(self, owner, effect_id).await?)
    }

    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreFailure> {
        Ok(SqliteRecords::release(self, owner).await?)
    }

    async fn begin(&self, owner: Owner<'_>, begin: Begin) -> Result<Option<WriteTx>, StoreFailure> {
        let sharing = match begin.alone {
            true => Sharing::Alone,
            false => Sharing::Shared,
        };
        Ok(SqliteRecords::begin(self, owner, sharing).await?)
    }

    async fn end(
        &self,
        transaction: &mut WriteTx,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreFailure> {
        Ok(SqliteRecords::end(self, transaction, owner, end).await?)
    }

    async fn commit(&self, transaction: WriteTx) -> Result<(), StoreFailure> {
        Ok(transaction.commit().await?)
    }

    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure> {
        Ok(SqliteRecords::take_over_abandoned(self, settle_after).await?)
    }
}

/// A batch is one write of the process's writer, its records completed one after another:
/// SQLite's writes already share their commits, so an engine on SQLite needs no batches
/// ([`SqliteRecords::engine`]); this is for the conformance suite and a service that wants one
/// engine setup for both backends.
#[async_trait]
impl RecordBatches for SqliteRecords {
    async fn begin_batch(&self) -> Result<WriteTx, StoreFailure> {
        Ok(self.begin_write().await?)
    }

    async fn complete_many(
        &self,
        transaction: &mut WriteTx,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> Result<Vec<Completion>, StoreFailure> {
        complete_each(self, transaction, records).await
    }
}
