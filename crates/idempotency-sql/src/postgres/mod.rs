//! The record store on PostgreSQL, the backend for several instances on one database.
//!
//! A fresh key is claimed by one `INSERT .. ON CONFLICT DO NOTHING`: the primary key decides
//! between concurrent duplicates, with no check-then-act window. Only a key that exists is
//! read under `FOR UPDATE` and judged, in one short transaction, so that two retries cannot
//! both take over a stale record. Every write after the claim is fenced on the generation and
//! attempt number it claimed with. `FOR UPDATE SKIP LOCKED` lets every instance run a
//! completer and a reaper at once, each on different rows.
//!
//! The statements are in `statements.rs`, whole. The pool is this module's too (`pool.rs`,
//! [`connect_lazy`]), because a failover is its business: a connection that found its node
//! demoted, or got no answer, makes every connection opened before it suspect, and each is
//! closed as it comes back to the pool.

mod claims;
mod pool;
mod statements;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_idempotency::engine::{
    Abandoned, Begin, Claim, Completion, End, Engine, Finish, Owner, RecordBatches, RecordStore,
    StoreFailure, Unmade, Verdict,
};
use payments_idempotency::{
    Fingerprint, IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, Scope, StoredResponse,
};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::PgConnectOptions;
use sqlx::{PgConnection, PgPool, Postgres};

use claims::ClaimQueue;
use pool::ANSWER_MARGIN;
pub use pool::{answer_bound, answered, connect_lazy, distrust_open_connections};
use statements::*;

use crate::error::{Error, no_answer};
use crate::row::{
    AbandonedRow, Generation, RecordWithClock, ResponseColumns, TakenOver, request_version,
};
use crate::{NewClaim, PendingEffect, PoolSettings};

/// The longest a statement of the finishes' queue ([`PgRecords::begin_batch`]) waits for a
/// row another transaction holds, or the pool's `lock_timeout` if that is shorter.
pub const BATCH_LOCK_WAIT: Duration = Duration::from_millis(200);

/// The fewest rows changed since the records table was last analyzed that make it worth
/// analyzing again ([`PgRecords::refresh_statistics`]): below it, a table is small enough that
/// any plan over it is cheap.
const ANALYZE_AFTER: f64 = 1_000.0;

/// The records of a PostgreSQL database. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgRecords {
    pool: PgPool,
    policy: IdempotencyPolicy,
    /// The claims of this process, written many to a statement (`claims.rs`).
    claims: ClaimQueue,
    /// How long a `BEGIN` may take: a connection from the pool, then the statement's answer.
    begin_bound: Duration,
    /// Begins the transaction of the finishes' queue: `BEGIN` and its `lock_timeout`
    /// ([`BATCH_LOCK_WAIT`]), in one round trip.
    begin_batch: String,
}

impl PgRecords {
    /// The records of the database `pool` connects to, which [`connect_lazy`] made.
    pub fn new(pool: PgPool, settings: &PoolSettings, policy: IdempotencyPolicy) -> Self {
        Self {
            claims: ClaimQueue::new(pool.clone(), policy),
            pool,
            policy,
            begin_bound: settings.acquire_timeout + settings.statement_timeout + ANSWER_MARGIN,
            begin_batch: format!(
                "BEGIN; SET LOCAL lock_timeout = '{}ms'",
                BATCH_LOCK_WAIT.min(settings.lock_timeout).as_millis()
            ),
        }
    }

    /// Opens the records of the database at `url` (`postgres://...`), creating the database
    /// if it is missing; the pool connects lazily afterwards. The schema is the service's to
    /// apply (its migrations, or [`create_schema`](Self::create_schema)).
    pub async fn open(
        url: &str,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Result<Self, Error> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| Error::Unusable(format!("not a valid PostgreSQL URL ({e})")))?;
        if !Postgres::database_exists(url).await? {
            Postgres::create_database(url).await?;
        }
        Ok(Self::new(connect_lazy(options, settings), settings, policy))
    }

    /// An engine over these records, given them as batches too: one statement completes a
    /// batch's records ([`RecordBatches`]).
    pub fn engine(&self) -> Engine<sqlx::Transaction<'static, Postgres>> {
        let records = Arc::new(self.clone());
        Engine::new(Arc::clone(&records) as _).with_batches(records)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn policy(&self) -> IdempotencyPolicy {
        self.policy
    }

    /// Shows every later statement of claims to `observer`, just before it is sent and
    /// once it is committed.
    pub fn observe_commits(&self, observer: std::sync::Arc<dyn crate::CommitObserver>) {
        self.claims.observe(observer);
    }

    /// The statements of claims so far, and the claims waiting for one now.
    pub fn group_commits(&self) -> crate::GroupCommits {
        self.claims.group_commits()
    }

    pub(crate) async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, Error> {
        let mut connection = self.pool.acquire().await?;
        read(&mut connection, READ, scope, key)
            .await?
            .map(RecordWithClock::into_record)
            .transpose()
    }

    /// The claim. Its insert shares a statement with this process's concurrent claims, and
    /// that statement reads the record of a key that exists, without a lock: most requests that
    /// find a record are answered from it (a replay, a 409 while another attempt holds the lock,
    /// a 422 for another payload), with no statement of their own. Only a key whose record must
    /// be taken over or replaced, or that the statement did not find (it was inserted while the
    /// statement ran), goes on to the claim under the lock, which decides again: what the
    /// statement read may have changed since. Two rounds at most: the record can vanish
    /// (reaped) before the locking read, and then the insert is tried once more.
    ///
    /// A key whose row another transaction holds for longer than the connection's
    /// `lock_timeout` (its record being written, or inserted, by an attempt that is slow or
    /// frozen mid-transaction) is answered as in flight, as a live lock is: that attempt holds
    /// it, and the claims of every other key go on meanwhile.
    pub(crate) async fn claim(&self, claim: NewClaim<'_>) -> Result<Claim, Error> {
        match self.claim_waiting_at_most_the_lock_timeout(claim).await {
            Err(Error::Busy(_)) => Ok(Claim::InFlight {
                retry_after_secs: 1,
            }),
            claimed => claimed,
        }
    }

    async fn claim_waiting_at_most_the_lock_timeout(
        &self,
        claim: NewClaim<'_>,
    ) -> Result<Claim, Error> {
        for _ in 0..2 {
            if let Some(claimed) = self.insert_or_answer(&claim).await? {
                return Ok(claimed);
            }
            let mut tx = self.begin_transaction().await?;
            let Some(found) = read(&mut tx, READ_LOCKED, claim.scope, claim.key).await? else {
                continue;
            };
            let (record, now) = found.into_record()?;
            let outcome = match Verdict::of(&record, claim.fingerprint, now) {
                Verdict::Answer(answer) => answer,
                Verdict::Resume(from) => {
                    let taken: TakenOver = answered(
                        sqlx::query_as(TAKE_OVER)
                            .bind(claim.scope.tenant.as_str())
                            .bind(claim.scope.operation.as_str())
                            .bind(claim.key.as_str())
                            .bind(self.policy.lock_timeout.as_secs_f64())
                            .fetch_one(&mut *tx),
                    )
                    .await?;
                    Claim::Owned(taken.claimed(from, record.effect_id))
                }
                Verdict::Replace => {
                    let new = Generation::new();
                    let (attempts,): (i32,) = answered(
                        new_generation(REPLACE, claim, self.policy, &new).fetch_one(&mut *tx),
                    )
                    .await?;
                    Claim::Owned(new.replacing(attempts))
                }
                // The record vanished in between: try the insert again.
                Verdict::Absent => continue,
            };
            answered(tx.commit()).await?;
            return Ok(outcome);
        }
        Err(Error::Corrupt(format!(
            "key {} neither inserts nor reads back",
            claim.key
        )))
    }

    /// Inserts the claim's pending record, in a statement shared with this process's
    /// concurrent claims, or answers from the record that statement found under the key.
    /// `None`: the key exists, and the claim under the lock decides.
    async fn insert_or_answer(&self, claim: &NewClaim<'_>) -> Result<Option<Claim>, Error> {
        let new = Generation::new();
        let attempts = match self.claims.insert(claim, new.id, &new.effect_key).await {
            claims::Verdict::Inserted(attempts) => Some(attempts),
            claims::Verdict::Exists(Some(found)) => {
                let (record, now) = found.into_record()?;
                return Ok(match Verdict::of(&record, claim.fingerprint, now) {
                    Verdict::Answer(answer) => Some(answer),
                    Verdict::Resume(_) | Verdict::Replace | Verdict::Absent => None,
                });
            }
            claims::Verdict::Exists(None) => None,
            claims::Verdict::Failed(error) => return Err(error),
            claims::Verdict::Alone => self.insert_pending_alone(claim, &new).await?,
        };
        Ok(attempts.map(|attempts| Claim::Owned(new.claimed(attempts))))
    }

    /// The claim's insert in a statement of its own, after its shared statement failed.
    async fn insert_pending_alone(
        &self,
        claim: &NewClaim<'_>,
        new: &Generation,
    ) -> Result<Option<i32>, Error> {
        let mut connection = self.pool.acquire().await?;
        let inserted: Option<(i32,)> = answered(
            new_generation(INSERT_PENDING, *claim, self.policy, new)
                .fetch_optional(&mut *connection),
        )
        .await?;
        Ok(inserted.map(|(attempts,)| attempts))
    }

    pub(crate) async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, Error> {
        let mut connection = self.pool.acquire().await?;
        let done = answered(
            fenced(RECORD_EFFECT, owner)
                .bind(effect_id)
                .execute(&mut *connection),
        )
        .await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    pub(crate) async fn release(&self, owner: Owner<'_>) -> Result<Finish, Error> {
        let mut connection = self.pool.acquire().await?;
        let done = answered(fenced(RELEASE, owner).execute(&mut *connection)).await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    pub(crate) async fn begin(
        &self,
        owner: Owner<'_>,
    ) -> Result<Option<sqlx::Transaction<'static, Postgres>>, Error> {
        let mut tx = self.begin_transaction().await?;
        let locked: Option<(i32,)> =
            answered(fenced_as(LOCK, owner).fetch_optional(&mut *tx)).await?;
        // Not found: dropped, the transaction is rolled back having written nothing.
        Ok(locked.map(|_| tx))
    }

    /// The transaction a record ends in: a `BEGIN` and no lock. Its end's fenced `UPDATE`
    /// takes the record's lock and checks the fence in one statement, where a lock taken
    /// first would cost a round trip of its own; for an owner that lost the record it
    /// matches nothing, and the engine drops the transaction with the operation's rows.
    pub(crate) async fn begin_ending(&self) -> Result<sqlx::Transaction<'static, Postgres>, Error> {
        self.begin_transaction().await
    }

    /// The transaction of the finishes the engine's queue writes together (one, or a batch):
    /// [`begin_ending`](Self::begin_ending)'s, whose statements wait for a row another
    /// transaction holds at most [`BATCH_LOCK_WAIT`]. Behind the queue's writer wait the
    /// finishes of every tenant of the operation; a finish whose row is held fails the batch
    /// there, having written nothing, and is written again alone, where it waits as long as
    /// any statement does without holding up the queue.
    pub(crate) async fn begin_batch(&self) -> Result<sqlx::Transaction<'static, Postgres>, Error> {
        self.begin_transaction_with(self.begin_batch.clone().into())
            .await
    }

    pub(crate) async fn end(
        &self,
        tx: &mut PgConnection,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, Error> {
        let ttl = self.policy.ttl.as_secs_f64();
        let expires_at: Option<(DateTime<Utc>,)> = match end {
            End::Made(response) | End::Unmade(Unmade::Answered(response)) => {
                let statement = match end {
                    End::Made(_) => COMPLETE,
                    _ => COMPLETE_WITHOUT_EFFECT,
                };
                let columns = ResponseColumns::of(response)?;
                answered(
                    fenced_as(statement, owner)
                        .bind(columns.status)
                        .bind(columns.headers)
                        .bind(columns.body)
                        .bind(columns.schema_version)
                        .bind(ttl)
                        .fetch_optional(&mut *tx),
                )
                .await?
            }
            End::Unmade(Unmade::Tombstoned) => {
                answered(fenced_as(FAIL, owner).bind(ttl).fetch_optional(&mut *tx)).await?
            }
            End::Unrecorded {
                effect_id,
                response,
            } => {
                let columns = ResponseColumns::of(response)?;
                answered(
                    fenced_as(COMPLETE_UNRECORDED, owner)
                        .bind(columns.status)
                        .bind(columns.headers)
                        .bind(columns.body)
                        .bind(columns.schema_version)
                        .bind(ttl)
                        .bind(effect_id)
                        .fetch_optional(&mut *tx),
                )
                .await?
            }
        };
        Ok(Completion::from_expiry(expires_at.map(|(at,)| at)))
    }

    /// Completes each of `records` in `tx`, fenced one by one, in one statement
    /// (`COMPLETE_MANY`): one completion per record, in their order.
    pub(crate) async fn complete_many(
        &self,
        tx: &mut PgConnection,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> Result<Vec<Completion>, Error> {
        let n = records.len();
        let (mut tenants, mut operations, mut keys) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut attempts, mut generations) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut statuses, mut headers, mut bodies, mut versions) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for &(owner, response) in records {
            let columns = ResponseColumns::of(response)?;
            tenants.push(owner.scope.tenant.as_str());
            operations.push(owner.scope.operation.as_str());
            keys.push(owner.key.as_str());
            attempts.push(owner.fence.attempt.0);
            generations.push(owner.fence.generation);
            statuses.push(columns.status);
            headers.push(columns.headers);
            bodies.push(columns.body);
            versions.push(columns.schema_version);
        }
        let completed: Vec<(i64, DateTime<Utc>)> = answered(
            sqlx::query_as(COMPLETE_MANY)
                .bind(tenants)
                .bind(operations)
                .bind(keys)
                .bind(attempts)
                .bind(generations)
                .bind(statuses)
                .bind(headers)
                .bind(bodies)
                .bind(versions)
                .bind(self.policy.ttl.as_secs_f64())
                .fetch_all(&mut *tx),
        )
        .await?;
        let mut completions = vec![Completion::Fenced; n];
        for (position, expires_at) in completed {
            let completion = usize::try_from(position - 1)
                .ok()
                .and_then(|index| completions.get_mut(index))
                .ok_or_else(|| Error::Corrupt(format!("a batch position of {position}")))?;
            *completion = Completion::Stored { expires_at };
        }
        Ok(completions)
    }

    pub(crate) async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, Error> {
        let mut connection = self.pool.acquire().await?;
        let row: Option<AbandonedRow> = answered(
            sqlx::query_as(TAKE_OVER_ABANDONED)
                .bind(self.policy.lock_timeout.as_secs_f64())
                .bind(settle_after.as_secs_f64())
                .fetch_optional(&mut *connection),
        )
        .await?;
        row.map(AbandonedRow::into_abandoned).transpose()
    }

    pub(crate) async fn take_over_by_effect_key(
        &self,
        effect_key: &str,
    ) -> Result<PendingEffect, Error> {
        let mut connection = self.pool.acquire().await?;
        let row: Option<AbandonedRow> = answered(
            sqlx::query_as(TAKE_OVER_BY_EFFECT_KEY)
                .bind(self.policy.lock_timeout.as_secs_f64())
                .bind(effect_key)
                .fetch_optional(&mut *connection),
        )
        .await?;
        if let Some(row) = row {
            return Ok(PendingEffect::TakenOver(row.into_abandoned()?));
        }
        let (pending,): (i64,) = answered(
            sqlx::query_as(COUNT_PENDING_BY_EFFECT_KEY)
                .bind(effect_key)
                .fetch_one(&mut *connection),
        )
        .await?;
        Ok(PendingEffect::in_flight_if(pending > 0))
    }

    pub(crate) async fn complete_held(
        &self,
        tx: &mut PgConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        response: &StoredResponse,
    ) -> Result<u64, Error> {
        let columns = ResponseColumns::of(response)?;
        let done = answered(
            sqlx::query(COMPLETE_HELD)
                .bind(scope.tenant.as_str())
                .bind(scope.operation.as_str())
                .bind(key.as_str())
                .bind(columns.status)
                .bind(columns.headers)
                .bind(columns.body)
                .bind(columns.schema_version)
                .bind(self.policy.ttl.as_secs_f64())
                .execute(tx),
        )
        .await?;
        Ok(done.rows_affected())
    }

    pub async fn reap_expired(&self, batch: i64) -> Result<u64, Error> {
        let mut connection = self.pool.acquire().await?;
        let done = answered(
            sqlx::query(REAP_EXPIRED)
                .bind(batch)
                .execute(&mut *connection),
        )
        .await?;
        Ok(done.rows_affected())
    }

    /// Analyzes the records table once more of its rows changed since it was last analyzed
    /// than that analyze counted, and at least [`ANALYZE_AFTER`]; returns whether it did.
    ///
    /// PostgreSQL plans each prepared statement over the table's statistics, and a connection
    /// keeps that plan until the statistics change. Planned over a table of a few rows (a new
    /// database, whose first analyze comes at its first few dozen rows or, with autovacuum
    /// off, never), the claims' statement reads the whole table for each batch, and a batch of
    /// finishes the entries its pending index keeps for every record completed since the
    /// table was last vacuumed: each grows with the table, until autovacuum analyzes it again
    /// (a minute later at best, which at thousands of records a second is too late). With
    /// autovacuum on, a table past its first minute is analyzed long before this rule would.
    pub(crate) async fn refresh_statistics(&self) -> Result<bool, Error> {
        let mut connection = self.pool.acquire().await?;
        let changes: Option<(i64, f64)> =
            answered(sqlx::query_as(CHANGES_SINCE_ANALYZE).fetch_optional(&mut *connection))
                .await?;
        // None: this role may not analyze the table, which stays autovacuum's.
        let Some((changed, counted)) = changes else {
            return Ok(false);
        };
        // `reltuples` is PostgreSQL's estimate, a float; row counts are exact as f64.
        if (changed as f64) < counted.max(ANALYZE_AFTER) {
            return Ok(false);
        }
        answered(sqlx::query(ANALYZE).execute(&mut *connection)).await?;
        Ok(true)
    }

    /// Begins a transaction on a task of its own.
    ///
    /// The driver's BEGIN is not cancel-safe: a caller dropped while BEGIN is in flight (its
    /// client hung up, or it timed out) returns the connection to the pool inside a
    /// transaction that nothing will end, and every later statement on that connection runs
    /// in it, uncommitted and holding its locks. On its own task the BEGIN always completes,
    /// and a transaction whose caller is gone is dropped there, which rolls it back. Once the
    /// caller holds the transaction, dropping it is safe.
    pub async fn begin_transaction(&self) -> Result<sqlx::Transaction<'static, Postgres>, Error> {
        self.begin_transaction_with("BEGIN".into()).await
    }

    /// [`begin_transaction`](Self::begin_transaction) with `statement`, which begins it.
    async fn begin_transaction_with(
        &self,
        statement: std::borrow::Cow<'static, str>,
    ) -> Result<sqlx::Transaction<'static, Postgres>, Error> {
        let pool = self.pool.clone();
        let begun = tokio::spawn(async move { pool.begin_with(statement).await });
        let begun = tokio::time::timeout(self.begin_bound, begun)
            .await
            .map_err(|_| Error::from(no_answer(self.begin_bound)))?;
        Ok(begun.map_err(|_| Error::from(sqlx::Error::WorkerCrashed))??)
    }

    /// Creates the records table and its indexes if they are missing (`schema/postgres.sql`).
    pub async fn create_schema(&self) -> Result<(), Error> {
        sqlx::raw_sql(SCHEMA).execute(&self.pool).await?;
        Ok(())
    }
}

/// The records table, as a service applies it.
pub const SCHEMA: &str = include_str!("../../schema/postgres.sql");

async fn read(
    connection: &mut PgConnection,
    statement: &'static str,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<RecordWithClock>, Error> {
    Ok(answered(
        sqlx::query_as(statement)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(key.as_str())
            .fetch_optional(connection),
    )
    .await?)
}

type Query<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;
type QueryAs<'q, R> = sqlx::query::QueryAs<'q, Postgres, R, sqlx::postgres::PgArguments>;

/// A new generation's record (`INSERT_PENDING`, `REPLACE`) with its ten values bound as `$1`
/// to `$10`: the claim, the lock timeout, the generation and its effect key, the retention.
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
        .bind(policy.lock_timeout.as_secs_f64())
        .bind(new.id)
        .bind(new.effect_key.as_str())
        .bind(policy.ttl.as_secs_f64())
        .bind(claim.request_body)
}

/// A fenced statement with the owner's five values bound as `$1` to `$5`.
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
    R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    sqlx::query_as(statement)
        .bind(owner.scope.tenant.as_str())
        .bind(owner.scope.operation.as_str())
        .bind(owner.key.as_str())
        .bind(owner.fence.attempt.0)
        .bind(owner.fence.generation)
}

/// The port on PostgreSQL, in PostgreSQL's own transaction: a service on this store alone
/// writes its rows in its `finish` with plain sqlx (`query.execute(&mut **transaction)`).
/// Each method is the store's own (inherent, with its [`Error`]), seen through the port.
#[async_trait]
impl RecordStore for PgRecords {
    type Transaction = sqlx::Transaction<'static, Postgres>;

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
        Ok(PgRecords::claim(self, claim).await?)
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreFailure> {
        Ok(PgRecords::find_record(self, scope, key).await?)
    }

    async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, StoreFailure> {
        Ok(PgRecords::record_effect(self, owner, effect_id).await?)
    }

    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreFailure> {
        Ok(PgRecords::release(self, owner).await?)
    }

    /// Every transaction is its own (PostgreSQL shares no commits): one that ends a record is
    /// begun without the record's lock, which its end takes with the fence.
    async fn begin(
        &self,
        owner: Owner<'_>,
        begin: Begin,
    ) -> Result<Option<Self::Transaction>, StoreFailure> {
        Ok(match begin.ending {
            true => Some(self.begin_ending().await?),
            false => PgRecords::begin(self, owner).await?,
        })
    }

    async fn end(
        &self,
        transaction: &mut Self::Transaction,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreFailure> {
        Ok(PgRecords::end(self, transaction, owner, end).await?)
    }

    async fn commit(&self, transaction: Self::Transaction) -> Result<(), StoreFailure> {
        Ok(answered(transaction.commit()).await.map_err(Error::from)?)
    }

    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure> {
        Ok(PgRecords::take_over_abandoned(self, settle_after).await?)
    }
}

/// One statement completes a batch's records (`COMPLETE_MANY`), in a transaction that waits
/// only briefly for a held row.
#[async_trait]
impl RecordBatches for PgRecords {
    async fn begin_batch(&self) -> Result<Self::Transaction, StoreFailure> {
        Ok(PgRecords::begin_batch(self).await?)
    }

    async fn complete_many(
        &self,
        transaction: &mut Self::Transaction,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> Result<Vec<Completion>, StoreFailure> {
        Ok(PgRecords::complete_many(self, transaction, records).await?)
    }
}
