//! The engine's record store over either backend: [`Records`] implements the engine's
//! [`RecordStore`] port once, over any [`Store`], so the engine never sees a database type.
//! Its transaction is the store's [`Transaction`], in which the payments operations write
//! their rows.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_idempotency::engine::{
    Abandoned, Claim, Completion, End, Finish, Owner, RecordStore, StoreFailure,
};
use payments_idempotency::{Fingerprint, IdempotencyKey, IdempotencyRecord, Scope};

use crate::repository::Store;
use crate::transaction::Transaction;

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
    type Transaction = Transaction;

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

    async fn begin(&self, owner: Owner<'_>) -> Result<Option<Transaction>, StoreFailure> {
        Ok(self.0.begin_over(owner).await?)
    }

    async fn end(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreFailure> {
        Ok(self.0.end_record(transaction, owner, end).await?)
    }

    async fn commit(&self, transaction: Transaction) -> Result<(), StoreFailure> {
        Ok(self.0.commit(transaction).await?)
    }

    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure> {
        Ok(self.0.take_over_abandoned(settle_after).await?)
    }
}
