//! The records of the idempotency protocol on PostgreSQL: the claim, the lock-free read, and
//! every fenced write of the attempt that owns a record, the finish among them.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::Charge;
use payments_idempotency::{Fingerprint, IdempotencyKey, IdempotencyRecord, Scope, StoredResponse};

use sqlx::{Postgres, QueryBuilder};

use super::PgStore;
use super::claim::lock_record;
use super::statements::push_charge_writes;
use crate::StoreError;
use crate::model::{Claim, Claimed, Completion, Fence, Finish, Verdict, judge};
use crate::repository::RecordRepository;
use crate::rows::RecordWithClock;
use crate::{claiming, fenced};

#[async_trait]
impl RecordRepository for PgStore {
    /// Claims `key` for a request with `fingerprint`, under the lock (the lock-free read that
    /// answers replays, 409s and 422s comes first, in `RecordRepository::claim`).
    ///
    /// A fresh key is claimed by a single `INSERT .. ON CONFLICT DO NOTHING`: the primary key
    /// decides between concurrent duplicates, with no check-then-act window. Only when the key
    /// exists does the claim read the record under `FOR UPDATE` and let [`decide`] judge it, in
    /// one short transaction, so that two retries cannot both take over a stale record.
    async fn claim_exclusive(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreError> {
        // Two rounds at most: the record can vanish (reaped) between the failed insert and the
        // locking read, and then the insert is tried once more.
        for _ in 0..2 {
            if let Some(claimed) = self
                .insert_pending(scope, key, fingerprint, request_body)
                .await?
            {
                return Ok(Claim::Owned(claimed));
            }
            let mut tx = self.begin().await?;
            let Some(locked) = lock_record(&mut tx, scope, key).await? else {
                continue;
            };
            let record = locked.row.into_record()?;
            let outcome = match judge(&record, fingerprint, locked.db_now) {
                Verdict::Answer(claim) => claim,
                Verdict::Resume(from) => {
                    let taken = self.take_over(&mut tx, scope, key).await?;
                    Claim::Owned(Claimed::taken_over(taken, from, record.processor_charge_id))
                }
                Verdict::Replace => Claim::Owned(
                    self.replace_expired(&mut tx, scope, key, fingerprint, request_body)
                        .await?,
                ),
                // The record vanished in between: try the insert again.
                Verdict::Absent => continue,
            };
            tx.commit().await?;
            return Ok(outcome);
        }
        Err(StoreError::Corrupt(format!(
            "key {key} neither inserts nor reads back"
        )))
    }

    /// Reads a record and the database clock, without locking.
    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreError> {
        let mut sql = claiming::read_record::<Postgres>(scope, key, false);
        let row: Option<RecordWithClock> = sql.build_query_as().fetch_optional(&self.pool).await?;
        row.map(RecordWithClock::into_record).transpose()
    }

    async fn record_charged(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        processor_charge_id: &str,
    ) -> Result<Finish, StoreError> {
        let mut sql = fenced::record_charged(scope, key, fence, processor_charge_id);
        let done = sql.build().execute(&self.pool).await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    async fn mark_failed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        let mut sql = fenced::mark_failed(scope, key, fence, self.policy.ttl);
        let done = sql.build().execute(&self.pool).await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    async fn release_lock(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        let mut sql = fenced::release_lock(scope, key, fence);
        let done = sql.build().execute(&self.pool).await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    async fn finish_without_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let mut sql = fenced::complete(scope, key, fence, response, self.policy.ttl)?;
        let stored: Option<DateTime<Utc>> =
            sql.build_query_scalar().fetch_optional(&self.pool).await?;
        Ok(Completion::from_expiry(stored))
    }

    /// Writes the charge, its ledger transaction, its `payment.completed` outbox event and the
    /// completed record as ONE statement: either all of them exist or none does.
    ///
    /// Data-modifying CTEs make it a single round trip and a single commit. The fenced update of
    /// the record is the gate every insert selects from: if another attempt owns the record,
    /// the update matches no row and nothing else is written. The ledger's balance trigger and
    /// the foreign keys are checked at the end of the statement and at commit as usual.
    async fn finish_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let mut sql = QueryBuilder::new("WITH gate AS (");
        fenced::push_complete(&mut sql, scope, key, fence, response, self.policy.ttl)?;
        sql.push("), ");
        push_charge_writes(&mut sql, charge)?;
        sql.push(" SELECT expires_at FROM gate");
        let stored: Option<DateTime<Utc>> =
            sql.build_query_scalar().fetch_optional(&self.pool).await?;
        Ok(Completion::from_expiry(stored))
    }
}
