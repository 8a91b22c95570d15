//! The one `RecordRepository` implementation, over any [`SqlStore`]: the lock-free read, every
//! fenced write of an owning attempt, and the steps of a claim under the lock, with the
//! statements of `claiming.rs` and `fenced.rs`.
//!
//! It also holds the transaction the engine ends a record in: begun with the record's fenced
//! touch, which locks it, ended with the record's fenced completion or failure, committed.
//!
//! What really differs stays with each backend, in its `SqlStore`: how a claim takes its lock
//! (`claim_under_lock`, built of the steps here: [`insert_pending`], [`read_record`],
//! [`act_on_locked`]), and where one write statement runs (`write_one`). The record's own
//! methods here know no operation's tables.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_idempotency::{
    Fingerprint, IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, Scope,
};

use crate::StoreError;
use crate::claiming::{self, NewClaim};
use crate::dialect::Dialect;
use crate::fenced;
use crate::model::{
    Claim, Claimed, Completion, End, Finish, Generation, Owner, TakenOver, Unmade, Verdict,
};
use crate::repository::RecordRepository;
use crate::rows::RecordWithClock;
use crate::sql_store::{SqlStore, complete_on};
use crate::transaction::Transaction;

/// Inserts a fresh pending record on `connection`, unless the key exists: `None` then.
pub(crate) async fn insert_pending<DB: Dialect>(
    connection: &mut DB::Connection,
    claim: &NewClaim<'_>,
    policy: IdempotencyPolicy,
) -> Result<Option<Claimed>, StoreError> {
    let new = Generation::new();
    let inserted: Option<(i32,)> = claiming::insert_pending::<DB>(*claim, &new, policy)
        .fetch_optional(connection)
        .await?;
    Ok(inserted.map(|(attempts,)| new.claimed(attempts)))
}

/// Reads a record and the database clock on `connection`, under a row lock when `lock` (see
/// [`claiming::read_record`]).
pub(crate) async fn read_record<DB: Dialect>(
    connection: &mut DB::Connection,
    scope: &Scope,
    key: &IdempotencyKey,
    lock: bool,
) -> Result<Option<RecordWithClock>, StoreError> {
    Ok(claiming::read_record::<DB>(scope, key, lock)
        .fetch_optional(connection)
        .await?)
}

/// Judges the record read under the lock and acts on it on `connection`: the answer it gives,
/// its takeover ([`claiming::take_over`]), or a new generation in its row
/// ([`claiming::replace`]). `None` if it is judged absent.
pub(crate) async fn act_on_locked<DB: Dialect>(
    connection: &mut DB::Connection,
    found: RecordWithClock,
    claim: &NewClaim<'_>,
    policy: IdempotencyPolicy,
) -> Result<Option<Claim>, StoreError> {
    let record = found.row.into_record()?;
    let (scope, key) = (claim.scope, claim.key);
    let outcome = match Verdict::of(&record, claim.fingerprint, found.db_now) {
        Verdict::Answer(answer) => answer,
        Verdict::Resume(from) => {
            let taken: TakenOver = claiming::take_over::<DB>(scope, key, policy.lock_timeout)
                .fetch_one(connection)
                .await?;
            Claim::Owned(taken.claimed(from, record.effect_id))
        }
        Verdict::Replace => {
            let new = Generation::new();
            let (attempts,): (i32,) = claiming::replace::<DB>(*claim, &new, policy)
                .fetch_one(connection)
                .await?;
            Claim::Owned(new.replacing(attempts))
        }
        Verdict::Absent => return Ok(None),
    };
    Ok(Some(outcome))
}

#[async_trait]
impl<S: SqlStore> RecordRepository for S {
    async fn claim_exclusive(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreError> {
        self.claim_under_lock(NewClaim {
            scope,
            key,
            fingerprint,
            request_body,
        })
        .await
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreError> {
        let mut connection = self.pool().acquire().await?;
        read_record::<S::Db>(&mut connection, scope, key, false)
            .await?
            .map(RecordWithClock::into_record)
            .transpose()
    }

    async fn record_effect(&self, owner: Owner<'_>, effect_id: &str) -> Result<Finish, StoreError> {
        let sql = fenced::record_effect(owner, effect_id);
        Ok(Finish::from_rows(self.write_one(sql).await?))
    }

    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreError> {
        Ok(Finish::from_rows(
            self.write_one(fenced::release(owner)).await?,
        ))
    }

    async fn begin_over(&self, owner: Owner<'_>) -> Result<Option<Transaction>, StoreError> {
        let mut write = self.begin_write().await?;
        let locked: Option<(i32,)> = fenced::lock::<S::Db>(owner)
            .fetch_optional(&mut write)
            .await?;
        // Not found: dropped, the transaction is rolled back having written nothing.
        Ok(locked.map(|_| write.into()))
    }

    async fn end_record(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreError> {
        let ttl = self.policy().ttl;
        let ending = match end {
            End::Made(response) => fenced::complete::<S::Db>(owner, response, ttl)?,
            End::Unmade(Unmade::Answered(response)) => {
                fenced::complete_without_effect::<S::Db>(owner, response, ttl)?
            }
            End::Unmade(Unmade::Tombstoned) => fenced::fail::<S::Db>(owner, ttl),
        };
        complete_on::<S::Db>(S::write_in(transaction)?, ending).await
    }

    async fn commit(&self, transaction: Transaction) -> Result<(), StoreError> {
        S::commit(S::into_write(transaction)?).await
    }
}
