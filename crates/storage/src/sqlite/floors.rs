//! The benchmark floors on SQLite (see [`FloorRepository`]): the charge's inserts without a
//! record, and a pending record inserted on its own. Not part of the service. The read floor
//! is the claim's own lock-free read, `find_record`. Compiled only with the `bench` feature.

use async_trait::async_trait;
use payments_domain::Charge;
use payments_idempotency::{Attempt, Fingerprint, IdempotencyKey, Scope};
use uuid::Uuid;

use super::reads::insert_charge_writes;
use super::{NOW, SqliteStore, now_plus, offset};
use crate::StoreError;
use crate::model::{Fence, processor_key_for};
use crate::repository::FloorRepository;

#[async_trait]
impl FloorRepository for SqliteStore {
    /// The finish's inserts, in one write transaction of their own.
    async fn write_charge_unguarded(&self, charge: &Charge) -> Result<(), StoreError> {
        let mut write = self.begin_write().await?;
        insert_charge_writes(&mut write.tx, charge).await?;
        write.commit().await?;
        Ok(())
    }

    /// The row a claim inserts for a fresh key, in a write transaction of its own (as every
    /// write here); without the claim's conflict handling and decision.
    async fn insert_pending_unguarded(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
        resource_id: Uuid,
    ) -> Result<Fence, StoreError> {
        let sql = format!(
            "INSERT INTO idempotency_records
                 (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point,
                  locked_until, attempts, resource_id, processor_key, created_at, expires_at,
                  updated_at, request_body)
             VALUES (?1, ?2, ?3, ?4, 'pending', 'started', {}, 1, ?6, ?7, {NOW}, {}, {NOW}, ?9)",
            now_plus("?5"),
            now_plus("?8"),
        );
        let mut write = self.begin_write().await?;
        sqlx::query(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(fingerprint.as_bytes().as_slice())
            .bind(offset(self.policy.lock_timeout))
            .bind(resource_id)
            .bind(processor_key_for(resource_id))
            .bind(offset(self.policy.ttl))
            .bind(request_body)
            .execute(&mut *write.tx)
            .await?;
        write.commit().await?;
        Ok(Fence {
            attempt: Attempt(1),
            resource_id,
        })
    }
}
