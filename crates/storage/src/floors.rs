//! The benchmark floors (`FloorRepository`), written once for both backends by
//! [`impl_floor_repository!`]: a pending record inserted on its own, with the claim's own
//! insert statement and none of its conflict handling, and the finish's inserts without a
//! record, which each backend writes as its finish does (`write_charge_alone`). Compiled only
//! with the `bench` feature; the read floor is the claim's own lock-free read, `find_record`.

/// Implements `FloorRepository` for `$store` of database `$db`, whose `write_statement` runs one
/// statement on its write path and whose `write_charge_alone` writes a charge's rows alone.
macro_rules! impl_floor_repository {
    ($store:ty, $db:ty) => {
        #[async_trait::async_trait]
        impl $crate::repository::FloorRepository for $store {
            async fn write_charge_unguarded(
                &self,
                charge: &payments_domain::Charge,
            ) -> Result<(), $crate::StoreError> {
                self.write_charge_alone(charge).await
            }

            async fn insert_pending_unguarded(
                &self,
                scope: &payments_idempotency::Scope,
                key: &payments_idempotency::IdempotencyKey,
                fingerprint: &payments_idempotency::Fingerprint,
                request_body: &[u8],
                resource_id: uuid::Uuid,
            ) -> Result<$crate::model::Fence, $crate::StoreError> {
                let generation = $crate::model::Generation::of(resource_id);
                let claim = $crate::claiming::NewClaim {
                    scope,
                    key,
                    fingerprint,
                    request_body,
                };
                let sql = $crate::claiming::insert_record::<$db>(claim, &generation, self.policy);
                self.write_statement(sql).await?;
                Ok($crate::model::Fence {
                    attempt: payments_idempotency::Attempt(1),
                    resource_id,
                })
            }
        }
    };
}

pub(crate) use impl_floor_repository;
