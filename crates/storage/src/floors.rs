//! The benchmark floors (`FloorRepository`), written once for both backends over any
//! [`SqlStore`]: a pending record inserted on its own, as the claim's insert does but with none
//! of its conflict handling, and the finish's inserts without a record, which each backend
//! writes as its finish does (`insert_charge`), committed on their own (`write_charge_alone`).
//! Compiled only with the `bench` feature; the read floor is the claim's own lock-free read,
//! `find_record`.

use async_trait::async_trait;
use payments_domain::Charge;
use payments_idempotency::engine::Fence;
use payments_idempotency::{Attempt, Fingerprint, IdempotencyKey, Scope};
use uuid::Uuid;

use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::repository::FloorRepository;
use crate::sql_store::SqlStore;

#[async_trait]
impl<S: SqlStore> FloorRepository for S {
    async fn write_charge_unguarded(&self, charge: &Charge) -> Result<(), StoreError> {
        self.write_charge_alone(charge).await
    }

    async fn insert_pending_unguarded(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
        generation: Uuid,
    ) -> Result<Fence, StoreError> {
        let policy = self.policy();
        let mut sql = Statement::<S::Db>::new(
            "INSERT INTO idempotency_records
                 (tenant_id, operation, idempotency_key, fingerprint, request_version, state,
                  recovery_point, locked_until, attempts, resource_id, processor_key, created_at,
                  expires_at, updated_at, request_body)
             VALUES (",
        );
        sql.value(scope.tenant.as_str())
            .push(", ")
            .value(scope.operation.as_str())
            .push(", ")
            .value(key.as_str())
            .push(", ")
            .value(fingerprint.as_bytes().as_slice())
            .push(", ")
            .value(i64::from(fingerprint.request_version()))
            .push(", 'pending', 'started', ");
        S::Db::push_now_plus(&mut sql, policy.lock_timeout);
        sql.push(", 1, ")
            .value(generation)
            .push(", ")
            .value(format!("effect_{}", generation.simple()))
            .push(", ")
            .push(S::Db::NOW)
            .push(", ");
        S::Db::push_now_plus(&mut sql, policy.ttl);
        sql.push(", ")
            .push(S::Db::NOW)
            .push(", ")
            .value(request_body)
            .push(")");
        self.write_one(sql).await?;
        Ok(Fence {
            attempt: Attempt(1),
            generation,
        })
    }
}
