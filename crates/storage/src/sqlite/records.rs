//! Idempotency records on SQLite: the claim and the fenced writes of the owning attempt.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::Charge;
use payments_idempotency::{Fingerprint, IdempotencyKey, IdempotencyRecord, Scope, StoredResponse};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

use super::SqliteStore;
use super::reads::insert_charge_writes;
use crate::StoreError;
use crate::model::{
    Claim, Claimed, Completion, Fence, Finish, Generation, TakenOver, Verdict, judge,
};
use crate::repository::RecordRepository;
use crate::rows::RecordWithClock;
use crate::{claiming, fenced};

impl SqliteStore {
    /// Runs one fenced single-statement update in a write transaction of its own.
    async fn run_fenced(&self, mut sql: QueryBuilder<'_, Sqlite>) -> Result<Finish, StoreError> {
        let mut write = self.begin_write().await?;
        let done = sql.build().execute(&mut *write.tx).await?;
        write.commit().await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Inserts a fresh pending record, unless the key exists: `None` then.
    async fn insert_pending(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Option<Claimed>, StoreError> {
        let new = Generation::new();
        let mut sql = claiming::insert_pending::<Sqlite>(
            scope,
            key,
            fingerprint,
            request_body,
            &new,
            self.policy,
        );
        let inserted: Option<i32> = sql.build_query_scalar().fetch_optional(conn).await?;
        Ok(inserted.map(|attempts| Claimed::fresh(attempts, new)))
    }

    /// Takes a stale or failed record over (see [`claiming::take_over`]).
    async fn take_over(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<TakenOver, StoreError> {
        let mut sql = claiming::take_over::<Sqlite>(scope, key, self.policy.lock_timeout);
        Ok(sql.build_query_as().fetch_one(conn).await?)
    }

    /// Starts a new generation in an expired or failed record's row (see
    /// [`claiming::replace`]).
    async fn replace_expired(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claimed, StoreError> {
        let new = Generation::new();
        let mut sql =
            claiming::replace::<Sqlite>(scope, key, fingerprint, request_body, &new, self.policy);
        let attempts: i32 = sql.build_query_scalar().fetch_one(conn).await?;
        Ok(Claimed::replacing(attempts, new))
    }
}

async fn read_record(
    conn: &mut SqliteConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<RecordWithClock>, StoreError> {
    let mut sql = claiming::read_record::<Sqlite>(scope, key, false);
    Ok(sql.build_query_as().fetch_optional(conn).await?)
}

#[async_trait]
impl RecordRepository for SqliteStore {
    /// The insert, the read and the decision run in one `BEGIN IMMEDIATE` transaction: the
    /// write lock is held from the first statement, so no other claim can interleave. Replays,
    /// 409s and 422s never get here: the lock-free read of `RecordRepository::claim` answers
    /// them without the write lock.
    async fn claim_exclusive(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreError> {
        let mut write = self.begin_write().await?;
        let conn = &mut *write.tx;
        if let Some(claimed) = self
            .insert_pending(conn, scope, key, fingerprint, request_body)
            .await?
        {
            write.commit().await?;
            return Ok(Claim::Owned(claimed));
        }
        let Some(found) = read_record(conn, scope, key).await? else {
            return Err(StoreError::Corrupt(format!(
                "key {key} neither inserts nor reads back"
            )));
        };
        let record = found.row.into_record()?;
        let outcome = match judge(&record, fingerprint, found.db_now) {
            Verdict::Answer(claim) => claim,
            Verdict::Resume(from) => {
                let taken = self.take_over(conn, scope, key).await?;
                Claim::Owned(Claimed::taken_over(taken, from, record.processor_charge_id))
            }
            Verdict::Replace => Claim::Owned(
                self.replace_expired(conn, scope, key, fingerprint, request_body)
                    .await?,
            ),
            // Under the write lock the record read just now cannot be absent.
            Verdict::Absent => {
                return Err(StoreError::Corrupt(format!(
                    "key {key} exists but was judged absent"
                )));
            }
        };
        write.commit().await?;
        Ok(outcome)
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        read_record(&mut conn, scope, key)
            .await?
            .map(RecordWithClock::into_record)
            .transpose()
    }

    async fn record_charged(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        processor_charge_id: &str,
    ) -> Result<Finish, StoreError> {
        self.run_fenced(fenced::record_charged(
            scope,
            key,
            fence,
            processor_charge_id,
        ))
        .await
    }

    async fn mark_failed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        self.run_fenced(fenced::mark_failed(scope, key, fence, self.policy.ttl))
            .await
    }

    async fn release_lock(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        self.run_fenced(fenced::release_lock(scope, key, fence))
            .await
    }

    async fn finish_without_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let mut write = self.begin_write().await?;
        let completion = self
            .complete_record(&mut write.tx, scope, key, fence, response)
            .await?;
        write.commit().await?;
        Ok(completion)
    }

    /// The fenced completion of the record gates the inserts: when it matches no row, the
    /// transaction is dropped (rolled back) having written nothing.
    async fn finish_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let mut write = self.begin_write().await?;
        let completion = self
            .complete_record(&mut write.tx, scope, key, fence, response)
            .await?;
        if completion == Completion::Fenced {
            return Ok(Completion::Fenced);
        }
        insert_charge_writes(&mut write.tx, charge).await?;
        write.commit().await?;
        Ok(completion)
    }
}

impl SqliteStore {
    /// The fenced completion of a record, on the caller's write transaction.
    async fn complete_record(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let mut sql = fenced::complete(scope, key, fence, response, self.policy.ttl)?;
        let stored: Option<DateTime<Utc>> = sql.build_query_scalar().fetch_optional(conn).await?;
        Ok(Completion::from_expiry(stored))
    }
}
