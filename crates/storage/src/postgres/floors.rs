//! The benchmark floors on PostgreSQL (see [`FloorRepository`]): the finish's inserts without
//! a record, and a pending record inserted on its own. Not part of the service, and compiled
//! only with the `bench` feature. The read floor is the claim's own lock-free read,
//! `find_record`.

use async_trait::async_trait;
use payments_domain::Charge;
use payments_idempotency::{Attempt, Fingerprint, IdempotencyKey, Scope};
use sqlx::QueryBuilder;
use uuid::Uuid;

use super::statements::push_charge_writes;
use super::{PgStore, secs};
use crate::StoreError;
use crate::model::{Fence, processor_key_for};
use crate::repository::FloorRepository;

#[async_trait]
impl FloorRepository for PgStore {
    /// The finish's very inserts (`push_charge_writes`) behind a gate that always yields its
    /// row: one statement, one commit, no idempotency record at all.
    async fn write_charge_unguarded(&self, charge: &Charge) -> Result<(), StoreError> {
        let mut sql = QueryBuilder::new("WITH gate AS (SELECT 1), ");
        push_charge_writes(&mut sql, charge)?;
        sql.push(" SELECT count(*) FROM gate");
        sql.build_query_scalar::<i64>()
            .fetch_one(&self.pool)
            .await?;
        Ok(())
    }

    /// The row a claim inserts for a fresh key, in one statement and one commit; without the
    /// claim's `ON CONFLICT` and decision, since the caller's key is new.
    async fn insert_pending_unguarded(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
        resource_id: Uuid,
    ) -> Result<Fence, StoreError> {
        sqlx::query(
            "INSERT INTO idempotency_records
                 (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point,
                  locked_until, attempts, resource_id, processor_key, created_at, expires_at,
                  request_body)
             VALUES ($1, $2, $3, $4, 'pending', 'started', now() + make_interval(secs => $5),
                     1, $6, $7, now(), now() + make_interval(secs => $8), $9)",
        )
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .bind(fingerprint.as_bytes().as_slice())
        .bind(secs(self.policy.lock_timeout))
        .bind(resource_id)
        .bind(processor_key_for(resource_id))
        .bind(secs(self.policy.ttl))
        .bind(request_body)
        .execute(&self.pool)
        .await?;
        Ok(Fence {
            attempt: Attempt(1),
            resource_id,
        })
    }
}
