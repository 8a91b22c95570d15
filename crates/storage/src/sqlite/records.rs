//! Idempotency records on SQLite: the claim and the fenced writes of the owning attempt.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::Charge;
use payments_idempotency::{Fingerprint, IdempotencyKey, IdempotencyRecord, Scope, StoredResponse};
use sqlx::SqliteConnection;
use uuid::Uuid;

use super::reads::insert_charge_writes;
use super::{NOW, SqliteStore, now_plus, offset};
use crate::StoreError;
use crate::model::{
    Claim, Claimed, Completion, Fence, Finish, TakenOver, Verdict, judge, processor_key_for,
};
use crate::repository::RecordRepository;
use crate::rows::{RecordRow, headers_to_json, stored_status};

/// A record and the database's clock, read in one statement.
#[derive(Debug, sqlx::FromRow)]
struct RecordWithClock {
    #[sqlx(flatten)]
    row: RecordRow,
    db_now: DateTime<Utc>,
}

// Every fenced statement carries this condition: the record is still pending and still holds
// the generation (resource id) and attempt number this attempt claimed with.
const FENCE: &str = "tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
                     AND attempts = ?4 AND resource_id = ?5 AND state = 'pending'";

fn fenced_sql(set: &str) -> String {
    format!("UPDATE idempotency_records SET {set}, updated_at = {NOW} WHERE {FENCE}")
}

type FencedQuery<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// The fenced update `sql` with the fence's five parameters bound; `set` may use `?6` on.
fn fenced_update<'q>(
    sql: &'q str,
    scope: &'q Scope,
    key: &'q IdempotencyKey,
    fence: Fence,
) -> FencedQuery<'q> {
    sqlx::query(sql)
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .bind(fence.attempt.0)
        .bind(fence.resource_id)
}

impl SqliteStore {
    /// Runs one fenced single-statement update.
    async fn fenced(
        &self,
        sql: &str,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        extra: Option<&str>,
    ) -> Result<Finish, StoreError> {
        let mut query = fenced_update(sql, scope, key, fence);
        if let Some(value) = extra {
            query = query.bind(value);
        }
        let mut write = self.begin_write().await?;
        let done = query.execute(&mut *write.tx).await?;
        write.commit().await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    async fn insert_pending(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Option<Claimed>, StoreError> {
        let resource_id = Uuid::new_v4();
        let processor_key = processor_key_for(resource_id);
        let sql = format!(
            "INSERT INTO idempotency_records
                 (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point,
                  locked_until, attempts, resource_id, processor_key, created_at, expires_at,
                  updated_at, request_body)
             VALUES (?1, ?2, ?3, ?4, 'pending', 'started', {}, 1, ?6, ?7, {NOW}, {}, {NOW}, ?9)
             ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
             RETURNING attempts",
            now_plus("?5"),
            now_plus("?8"),
        );
        let inserted: Option<i32> = sqlx::query_scalar(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(fingerprint.as_bytes().as_slice())
            .bind(offset(self.policy.lock_timeout))
            .bind(resource_id)
            .bind(&processor_key)
            .bind(offset(self.policy.ttl))
            .bind(request_body)
            .fetch_optional(conn)
            .await?;
        Ok(inserted.map(|attempts| Claimed::fresh(attempts, resource_id, processor_key)))
    }

    /// Gives a stale or failed record to this attempt, keeping its resource id, processor key
    /// and recovery point: the attempt resumes the same request, it does not start a new one.
    async fn take_over(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<TakenOver, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET state = 'pending', attempts = attempts + 1, locked_until = {}, updated_at = {NOW}
             WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
             RETURNING attempts, resource_id, processor_key",
            now_plus("?4"),
        );
        Ok(sqlx::query_as(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(offset(self.policy.lock_timeout))
            .fetch_one(conn)
            .await?)
    }

    /// Reuses an expired or failed record's row for a new generation: a new resource id and
    /// processor key (a failed record's old key is tombstoned at the processor), `attempts`
    /// still counting. A straggler of the old generation can never pass the new one's fence.
    async fn replace_expired(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claimed, StoreError> {
        let resource_id = Uuid::new_v4();
        let processor_key = processor_key_for(resource_id);
        let sql = format!(
            "UPDATE idempotency_records
             SET fingerprint = ?4, state = 'pending', recovery_point = 'started',
                 attempts = attempts + 1, locked_until = {}, resource_id = ?6,
                 processor_key = ?7, processor_charge_id = NULL, response_status = NULL,
                 response_headers = NULL, response_body = NULL, created_at = {NOW},
                 expires_at = {}, updated_at = {NOW}, request_body = ?9
             WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
             RETURNING attempts",
            now_plus("?5"),
            now_plus("?8"),
        );
        let attempts: i32 = sqlx::query_scalar(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(fingerprint.as_bytes().as_slice())
            .bind(offset(self.policy.lock_timeout))
            .bind(resource_id)
            .bind(&processor_key)
            .bind(offset(self.policy.ttl))
            .bind(request_body)
            .fetch_one(conn)
            .await?;
        Ok(Claimed::replacing(attempts, resource_id, processor_key))
    }
}

async fn read_record(
    conn: &mut SqliteConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<RecordWithClock>, StoreError> {
    let sql = format!(
        "SELECT r.*, {NOW} AS db_now FROM idempotency_records r
         WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3"
    );
    Ok(sqlx::query_as(&sql)
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .fetch_optional(conn)
        .await?)
}

#[async_trait]
impl RecordRepository for SqliteStore {
    /// The insert, the read and the decision run in one `BEGIN IMMEDIATE` transaction: the
    /// write lock is held from the first statement, so no other claim can interleave. Replays,
    /// 409s and 422s never get here: the lock-free read of `RecordRepository::claim` answers
    /// them without the write lock.
    async fn claim_exclusive(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreError> {
        let mut write = self.begin_write().await?;
        let conn = &mut *write.tx;
        if let Some(claimed) = self
            .insert_pending(conn, scope, key, fingerprint, request_body)
            .await?
        {
            write.commit().await?;
            return Ok(Claim::Owned(claimed));
        }
        let Some(found) = read_record(conn, scope, key).await? else {
            return Err(StoreError::Corrupt(format!(
                "key {key} neither inserts nor reads back"
            )));
        };
        let record = found.row.into_record()?;
        let outcome = match judge(&record, fingerprint, found.db_now) {
            Verdict::Answer(claim) => claim,
            Verdict::Resume(from) => {
                let taken = self.take_over(conn, scope, key).await?;
                Claim::Owned(Claimed::taken_over(taken, from, record.processor_charge_id))
            }
            Verdict::Replace => Claim::Owned(
                self.replace_expired(conn, scope, key, fingerprint, request_body)
                    .await?,
            ),
            // Under the write lock the record read just now cannot be absent.
            Verdict::Absent => {
                return Err(StoreError::Corrupt(format!(
                    "key {key} exists but was judged absent"
                )));
            }
        };
        write.commit().await?;
        Ok(outcome)
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        read_record(&mut conn, scope, key)
            .await?
            .map(|found| Ok((found.row.into_record()?, found.db_now)))
            .transpose()
    }

    async fn record_charged(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        processor_charge_id: &str,
    ) -> Result<Finish, StoreError> {
        let sql = fenced_sql("recovery_point = 'charged', processor_charge_id = ?6");
        self.fenced(&sql, scope, key, fence, Some(processor_charge_id))
            .await
    }

    /// A record that holds a processor charge id is never failed: the charge must reach the
    /// ledger. Retention counts from the failure.
    async fn mark_failed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET state = 'failed', locked_until = NULL, expires_at = {}, updated_at = {NOW}
             WHERE {FENCE} AND processor_charge_id IS NULL",
            now_plus("?6"),
        );
        let ttl = offset(self.policy.ttl);
        self.fenced(&sql, scope, key, fence, Some(&ttl)).await
    }

    async fn release_lock(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        let sql = fenced_sql(&format!("locked_until = {NOW}"));
        self.fenced(&sql, scope, key, fence, None).await
    }

    async fn finish_without_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let mut write = self.begin_write().await?;
        let completion = self
            .complete_record(&mut write.tx, scope, key, fence, response)
            .await?;
        write.commit().await?;
        Ok(completion)
    }

    /// The fenced completion of the record gates the inserts: when it matches no row, the
    /// transaction is dropped (rolled back) having written nothing.
    async fn finish_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let mut write = self.begin_write().await?;
        let completion = self
            .complete_record(&mut write.tx, scope, key, fence, response)
            .await?;
        if completion == Completion::Fenced {
            return Ok(Completion::Fenced);
        }
        insert_charge_writes(&mut write.tx, charge).await?;
        write.commit().await?;
        Ok(completion)
    }
}

impl SqliteStore {
    /// The fenced completion of a record. Retention is counted from the completion, never
    /// from the claim, so a record completed late in its life is replayed for the whole TTL.
    async fn complete_record(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET state = 'completed', recovery_point = 'finished', locked_until = NULL,
                 response_status = ?6, response_headers = ?7, response_body = ?8,
                 expires_at = {}, updated_at = {NOW}
             WHERE {FENCE}
             RETURNING expires_at",
            now_plus("?9"),
        );
        let stored: Option<DateTime<Utc>> = sqlx::query_scalar(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(fence.attempt.0)
            .bind(fence.resource_id)
            .bind(stored_status(response)?)
            .bind(headers_to_json(&response.headers))
            .bind(&response.body)
            .bind(offset(self.policy.ttl))
            .fetch_optional(conn)
            .await?;
        Ok(Completion::from_expiry(stored))
    }
}
