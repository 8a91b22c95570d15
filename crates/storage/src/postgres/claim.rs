//! The steps of a claim under the lock (`RecordRepository::claim_exclusive` in
//! `records.rs`): the insert of a fresh key, the locking read, the takeover of an abandoned
//! record and the replacement of an expired or failed one.

use chrono::{DateTime, Utc};
use payments_idempotency::{Fingerprint, IdempotencyKey, Scope};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{PgStore, secs};
use crate::StoreError;
use crate::model::{Claimed, TakenOver, processor_key_for};
use crate::rows::RecordRow;

/// A row read under its lock, with the database's clock: all instances judge lock expiry by
/// the same clock, never their own.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct LockedRecordRow {
    #[sqlx(flatten)]
    pub(super) row: RecordRow,
    pub(super) db_now: DateTime<Utc>,
}

impl PgStore {
    /// Inserts a fresh pending record, unless the key exists: `None` then.
    pub(super) async fn insert_pending(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Option<Claimed>, StoreError> {
        let resource_id = Uuid::new_v4();
        let processor_key = processor_key_for(resource_id);
        let inserted: Option<i32> = sqlx::query_scalar(
            "INSERT INTO idempotency_records
                 (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point,
                  locked_until, attempts, resource_id, processor_key, created_at, expires_at,
                  request_body)
             VALUES ($1, $2, $3, $4, 'pending', 'started',
                     now() + make_interval(secs => $5), 1, $6, $7, now(), now() + make_interval(secs => $8),
                     $9)
             ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
             RETURNING attempts",
        )
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .bind(fingerprint.as_bytes().as_slice())
        .bind(secs(self.policy.lock_timeout))
        .bind(resource_id)
        .bind(&processor_key)
        .bind(secs(self.policy.ttl))
        .bind(request_body)
        .fetch_optional(&self.pool)
        .await?;
        Ok(inserted.map(|attempts| Claimed::fresh(attempts, resource_id, processor_key)))
    }

    /// Gives a stale or failed record to this attempt, keeping its resource id, processor key
    /// and recovery point: the attempt resumes the same request, it does not start a new one.
    pub(super) async fn take_over(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<TakenOver, StoreError> {
        Ok(sqlx::query_as(
            "UPDATE idempotency_records
             SET state = 'pending', attempts = attempts + 1,
                 locked_until = now() + make_interval(secs => $4), updated_at = now()
             WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
             RETURNING attempts, resource_id, processor_key",
        )
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .bind(secs(self.policy.lock_timeout))
        .fetch_one(conn)
        .await?)
    }

    /// Reuses an expired or failed record's row for a new generation: a new resource id and
    /// processor key (a failed record's old key is tombstoned at the processor), `attempts`
    /// still counting. A straggler of the old generation can never pass the new one's fence.
    pub(super) async fn replace_expired(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claimed, StoreError> {
        let resource_id = Uuid::new_v4();
        let processor_key = processor_key_for(resource_id);
        let attempts: i32 = sqlx::query_scalar(
            "UPDATE idempotency_records
             SET fingerprint = $4, state = 'pending', recovery_point = 'started',
                 attempts = attempts + 1, locked_until = now() + make_interval(secs => $5),
                 resource_id = $6, processor_key = $7, processor_charge_id = NULL,
                 response_status = NULL, response_headers = NULL, response_body = NULL,
                 created_at = now(), expires_at = now() + make_interval(secs => $8), updated_at = now(),
                 request_body = $9
             WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
             RETURNING attempts",
        )
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .bind(fingerprint.as_bytes().as_slice())
        .bind(secs(self.policy.lock_timeout))
        .bind(resource_id)
        .bind(&processor_key)
        .bind(secs(self.policy.ttl))
        .bind(request_body)
        .fetch_one(conn)
        .await?;
        Ok(Claimed::replacing(attempts, resource_id, processor_key))
    }
}

/// Reads the record under a row lock (`FOR UPDATE`): concurrent claims of one existing key
/// queue here, so exactly one of them can take a stale record over.
pub(super) async fn lock_record(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<LockedRecordRow>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT r.*, now() AS db_now FROM idempotency_records r
         WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
         FOR UPDATE",
    )
    .bind(&scope.tenant)
    .bind(&scope.operation)
    .bind(key.as_str())
    .fetch_optional(conn)
    .await?)
}
