//! The record store on PostgreSQL, the backend for several instances on one database.
//!
//! A fresh key is claimed by one `INSERT .. ON CONFLICT DO NOTHING`: the primary key decides
//! between concurrent duplicates, with no check-then-act window. Only a key that exists is
//! read under `FOR UPDATE` and judged, in one short transaction, so that two retries cannot
//! both take over a stale record. Every write after the claim is fenced on the generation and
//! attempt number it claimed with. `FOR UPDATE SKIP LOCKED` lets every instance run a
//! completer and a reaper at once, each on different rows.
//!
//! The pool is this module's too ([`connect_lazy`]), because a failover is its business: a
//! connection that found its node demoted, or got no answer, makes every connection opened
//! before it suspect, and each is closed as it comes back to the pool.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use payments_idempotency::engine::{
    Abandoned, Claim, Completion, End, Finish, Owner, Unmade, Verdict,
};
use payments_idempotency::{
    IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, Scope, StoredResponse,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};

use crate::error::{Error, no_answer};
use crate::row::{
    AbandonedRow, Generation, RecordWithClock, ResponseColumns, TakenOver, request_version,
};
use crate::{NewClaim, PendingEffect, PoolSettings};

/// A fresh pending record at attempt 1, locked for the lock timeout (`$6` seconds), with a
/// provisional expiry (`$9`) that its completion replaces. No row: the key exists.
const INSERT_PENDING: &str = "
INSERT INTO idempotency_records
    (tenant_id, operation, idempotency_key, fingerprint, request_version, state, recovery_point,
     locked_until, attempts, resource_id, processor_key, created_at, expires_at, updated_at,
     request_body)
VALUES ($1, $2, $3, $4, $5, 'pending', 'started', now() + make_interval(secs => $6), 1, $7, $8,
        now(), now() + make_interval(secs => $9), now(), $10)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING attempts";

/// A record and the database's clock, without a lock.
const READ: &str = "
SELECT r.*, now() AS db_now FROM idempotency_records r
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3";

/// The same, under the row lock: concurrent claims of one existing key queue here, so that
/// exactly one of them can take a stale record over.
const READ_LOCKED: &str = "
SELECT r.*, now() AS db_now FROM idempotency_records r
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
FOR UPDATE";

/// Gives a stale record to this attempt, keeping its generation, effect key and recovery
/// point: it resumes the same request. `attempts + 1` fences off the attempt it takes over.
const TAKE_OVER: &str = "
UPDATE idempotency_records
SET state = 'pending', attempts = attempts + 1, locked_until = now() + make_interval(secs => $4),
    updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
RETURNING attempts, resource_id, processor_key";

/// Reuses an expired or failed record's row for a new generation, `attempts` still counting:
/// a straggler of the old generation can never pass the new one's fence.
const REPLACE: &str = "
UPDATE idempotency_records
SET fingerprint = $4, request_version = $5, state = 'pending', recovery_point = 'started',
    attempts = attempts + 1, locked_until = now() + make_interval(secs => $6), resource_id = $7,
    processor_key = $8, effect_id = NULL, response_status = NULL, response_headers = NULL,
    response_body = NULL, response_schema_version = NULL, created_at = now(),
    expires_at = now() + make_interval(secs => $9), updated_at = now(), request_body = $10
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
RETURNING attempts";

/// The effect is made: a takeover resumes from here without making it again. Fenced, as every
/// statement below: it matches only while the record is pending and still holds the attempt
/// number (`$4`) and generation (`$5`) its owner claimed with.
const RECORD_EFFECT: &str = "
UPDATE idempotency_records SET recovery_point = 'charged', effect_id = $6, updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'";

/// Gives up the lock after an unknown outcome: the record stays pending and is stale at once.
const RELEASE: &str = "
UPDATE idempotency_records SET locked_until = now(), updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'";

/// Locks the record its owner holds, in the transaction the engine ends it in: no takeover or
/// completer ends this generation meanwhile. A lock, not a write.
const LOCK: &str = "
SELECT attempts FROM idempotency_records
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'
FOR UPDATE";

/// Completes the record with its response. Retention counts from the completion (`$10`
/// seconds), never from the claim.
const COMPLETE: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = $6,
    response_headers = $7, response_body = $8, response_schema_version = $9,
    expires_at = now() + make_interval(secs => $10), updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'
RETURNING expires_at";

/// Completes a record that made no effect (a decline, a refusal): a record holding an effect
/// id never ends this way, since its effect must be written with its operation's rows.
const COMPLETE_WITHOUT_EFFECT: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = $6,
    response_headers = $7, response_body = $8, response_schema_version = $9,
    expires_at = now() + make_interval(secs => $10), updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending' AND effect_id IS NULL
RETURNING expires_at";

/// Fails the record once its effect key is tombstoned: the next claim starts a new generation.
/// A record holding an effect id is never failed.
const FAIL: &str = "
UPDATE idempotency_records
SET state = 'failed', locked_until = NULL, expires_at = now() + make_interval(secs => $6),
    updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending' AND effect_id IS NULL
RETURNING expires_at";

/// The completer's takeover: the pending record whose lock ended longest ago, if at least `$2`
/// seconds ago, locked for `$1` seconds. `SKIP LOCKED`: each instance takes a different row.
const TAKE_OVER_ABANDONED: &str = "
UPDATE idempotency_records
SET attempts = attempts + 1, locked_until = now() + make_interval(secs => $1), updated_at = now()
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state = 'pending' AND locked_until < now() - make_interval(secs => $2)
    ORDER BY locked_until
    LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING tenant_id, operation, idempotency_key, attempts, resource_id, processor_key,
          recovery_point, effect_id, request_body, request_version";

/// The reaper: up to `$1` expired finished records, the longest expired first, along the
/// partial index `idempotency_records_expiry`. Never a pending record, nor a failed one that
/// holds an effect id.
const REAP_EXPIRED: &str = "
DELETE FROM idempotency_records
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state <> 'pending' AND expires_at <= now()
      AND (effect_id IS NULL OR state = 'completed')
    ORDER BY expires_at
    LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Takes over the pending record that made (or is making) the effect under effect key `$2`,
/// once its lock has ended, for `$1` seconds: a reconciler found the effect at its maker, so
/// no call under the key can still be on its way, and there is no grace to wait for.
const TAKE_OVER_BY_EFFECT_KEY: &str = "
UPDATE idempotency_records
SET attempts = attempts + 1, locked_until = now() + make_interval(secs => $1), updated_at = now()
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state = 'pending' AND processor_key = $2 AND locked_until < now()
    LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING tenant_id, operation, idempotency_key, attempts, resource_id, processor_key,
          recovery_point, effect_id, request_body, request_version";

/// Whether a pending record holds effect key `$1`.
const COUNT_PENDING_BY_EFFECT_KEY: &str = "
SELECT count(*) FROM idempotency_records WHERE state = 'pending' AND processor_key = $1";

/// Completes a pending record that no attempt will ever finish (an operator voided its
/// effect), whichever attempt holds it: `attempts + 1` fences off an attempt still at work,
/// which then answers from the record. A record holding an effect id is left alone.
const COMPLETE_HELD: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = $4,
    response_headers = $5, response_body = $6, response_schema_version = $7,
    expires_at = now() + make_interval(secs => $8), attempts = attempts + 1, updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND state = 'pending' AND effect_id IS NULL";

/// The records of a PostgreSQL database. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgRecords {
    pool: PgPool,
    policy: IdempotencyPolicy,
    /// How long a `BEGIN` may take: a connection from the pool, then the statement's answer.
    begin_bound: Duration,
}

impl PgRecords {
    /// The records of the database `pool` connects to, which [`connect_lazy`] made.
    pub fn new(pool: PgPool, settings: &PoolSettings, policy: IdempotencyPolicy) -> Self {
        Self {
            pool,
            policy,
            begin_bound: settings.acquire_timeout + settings.statement_timeout + ANSWER_MARGIN,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn policy(&self) -> IdempotencyPolicy {
        self.policy
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

    /// The claim under the lock. Two rounds at most: the record can vanish (reaped) between
    /// the failed insert and the locking read, and then the insert is tried once more.
    pub(crate) async fn claim_exclusive(&self, claim: NewClaim<'_>) -> Result<Claim, Error> {
        for _ in 0..2 {
            let mut connection = self.pool.acquire().await?;
            if let Some(claimed) = self.insert_pending(&mut connection, &claim).await? {
                return Ok(Claim::Owned(claimed));
            }
            drop(connection);
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
                        sqlx::query_as(REPLACE)
                            .bind(claim.scope.tenant.as_str())
                            .bind(claim.scope.operation.as_str())
                            .bind(claim.key.as_str())
                            .bind(claim.fingerprint.as_bytes().as_slice())
                            .bind(request_version(claim.fingerprint))
                            .bind(self.policy.lock_timeout.as_secs_f64())
                            .bind(new.id)
                            .bind(new.effect_key.as_str())
                            .bind(self.policy.ttl.as_secs_f64())
                            .bind(claim.request_body)
                            .fetch_one(&mut *tx),
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

    async fn insert_pending(
        &self,
        connection: &mut PgConnection,
        claim: &NewClaim<'_>,
    ) -> Result<Option<payments_idempotency::engine::Claimed>, Error> {
        let new = Generation::new();
        let inserted: Option<(i32,)> = answered(
            sqlx::query_as(INSERT_PENDING)
                .bind(claim.scope.tenant.as_str())
                .bind(claim.scope.operation.as_str())
                .bind(claim.key.as_str())
                .bind(claim.fingerprint.as_bytes().as_slice())
                .bind(request_version(claim.fingerprint))
                .bind(self.policy.lock_timeout.as_secs_f64())
                .bind(new.id)
                .bind(new.effect_key.as_str())
                .bind(self.policy.ttl.as_secs_f64())
                .bind(claim.request_body)
                .fetch_optional(connection),
        )
        .await?;
        Ok(inserted.map(|(attempts,)| new.claimed(attempts)))
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
        };
        Ok(Completion::from_expiry(expires_at.map(|(at,)| at)))
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

    pub(crate) async fn reap_expired(&self, batch: i64) -> Result<u64, Error> {
        let mut connection = self.pool.acquire().await?;
        let done = answered(
            sqlx::query(REAP_EXPIRED)
                .bind(batch)
                .execute(&mut *connection),
        )
        .await?;
        Ok(done.rows_affected())
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
        let pool = self.pool.clone();
        let begun = tokio::spawn(async move { pool.begin().await });
        let begun = tokio::time::timeout(self.begin_bound, begun)
            .await
            .map_err(|_| Error::from(no_answer(self.begin_bound)))?;
        Ok(begun.map_err(|_| Error::from(sqlx::Error::WorkerCrashed))??)
    }

    /// Creates the records table and its indexes if they are missing (`schema/postgres.sql`).
    pub(crate) async fn create_schema(&self) -> Result<(), Error> {
        sqlx::raw_sql(SCHEMA).execute(&self.pool).await?;
        Ok(())
    }
}

/// The records table, as a service applies it.
pub const SCHEMA: &str = include_str!("../schema/postgres.sql");

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

/// When the process last had reason to distrust every open connection, in milliseconds on
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

/// How much longer than `statement_timeout` a statement is waited for before it is given up:
/// a server that runs cancels it first, and its answer says why.
const ANSWER_MARGIN: Duration = Duration::from_secs(1);

fn millis_on_clock() -> u64 {
    u64::try_from(CLOCK.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The connections opened until now leave the pool as they come back to it.
pub fn distrust_open_connections() {
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
pub fn answer_bound() -> Option<Duration> {
    match ANSWER_BOUND_MS.load(Ordering::Relaxed) {
        0 => None,
        millis => Some(Duration::from_millis(millis)),
    }
}

/// Waits for `work`, a statement's or a `COMMIT`'s round trip, at most [`answer_bound`].
/// Dropped there, the connection is left mid-conversation: the error distrusts it, so it
/// leaves the pool as it comes back.
pub async fn answered<T>(
    work: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    match answer_bound() {
        None => work.await,
        Some(bound) => tokio::time::timeout(bound, work)
            .await
            .unwrap_or_else(|_| Err(no_answer(bound))),
    }
}

/// A pool that connects lazily: a service starts even while the database is down, answers
/// 503 until it is back, and recovers without a restart. Its statements are cancelled by the
/// server at `statement_timeout`, and given up by [`answered`] a little later.
pub fn connect_lazy(options: PgConnectOptions, settings: &PoolSettings) -> PgPool {
    LazyLock::force(&CLOCK);
    let timeout_ms = settings.statement_timeout.as_millis();
    let options = options.options([("statement_timeout", timeout_ms)]);
    let bound = settings.statement_timeout + ANSWER_MARGIN;
    ANSWER_BOUND_MS.fetch_max(
        u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    // No ping before each acquire: it would add a round trip to every statement on the hot
    // path. A connection that died is found by its next statement, which fails as unavailable
    // (503, nothing executed) and is dropped from the pool; one that reached a demoted
    // primary, or that went unanswered, is closed as it comes back (`opened_before_distrust`).
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .test_before_acquire(false)
        .after_release(|_, connection| {
            let keep = !opened_before_distrust(connection.age);
            Box::pin(async move { Ok(keep) })
        })
        .connect_lazy_with(options)
}
