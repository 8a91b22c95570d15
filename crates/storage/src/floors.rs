//! The benchmark floors (`FloorRepository`), written once for both backends over any
//! [`SqlStore`]: a pending record inserted on its own, with the claim's own insert statement
//! and none of its conflict handling, and the finish's inserts without a record, which each
//! backend writes as its finish does (`insert_charge`), committed on their own
//! (`write_charge_alone`). Compiled only with the `bench`
//! feature; the read floor is the claim's own lock-free read, `find_record`.

use async_trait::async_trait;
use payments_domain::Charge;
use payments_idempotency::{Attempt, Fingerprint, IdempotencyKey, Scope};
use uuid::Uuid;

use crate::StoreError;
use crate::claiming::{self, NewClaim};
use crate::model::Generation;
use crate::repository::FloorRepository;
use crate::sql_store::SqlStore;
use payments_idempotency::engine::Fence;

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
        resource_id: Uuid,
    ) -> Result<Fence, StoreError> {
        let generation = Generation::of(resource_id);
        let claim = NewClaim {
            scope,
            key,
            fingerprint,
            request_body,
        };
        let sql = claiming::insert_record::<S::Db>(claim, &generation, self.policy());
        self.write_one(sql).await?;
        Ok(Fence {
            attempt: Attempt(1),
            generation: resource_id,
        })
    }
}
