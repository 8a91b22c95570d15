//! The engine's record store over either backend: [`Records`] implements the engine's
//! [`RecordStore`] port once, over any [`Store`], so the engine never sees a database type.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_idempotency::engine::{
    Abandoned, Claim, Completion, Finish, Owner, RecordStore, StoreFailure,
};
use payments_idempotency::{Fingerprint, IdempotencyKey, IdempotencyRecord, Scope, StoredResponse};

use crate::repository::Store;

/// The idempotency records of a store, as the engine works on them.
#[derive(Debug, Clone)]
pub struct Records(Arc<dyn Store>);

impl Records {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self(store)
    }
}

#[async_trait]
impl RecordStore for Records {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreFailure> {
        Ok(self.0.claim(scope, key, fingerprint, request_body).await?)
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreFailure> {
        Ok(self.0.find_record(scope, key).await?)
    }

    async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, StoreFailure> {
        Ok(self.0.record_effect(owner, effect_id).await?)
    }

    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreFailure> {
        Ok(self.0.release(owner).await?)
    }

    async fn complete_without_effect(
        &self,
        owner: Owner<'_>,
        response: &StoredResponse,
    ) -> Result<Completion, StoreFailure> {
        Ok(self.0.complete_without_effect(owner, response).await?)
    }

    async fn fail(&self, owner: Owner<'_>) -> Result<Completion, StoreFailure> {
        Ok(self.0.fail(owner).await?)
    }

    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure> {
        Ok(self.0.take_over_abandoned(settle_after).await?)
    }
}
