//! Idempotency records on SQLite: what differs from PostgreSQL in `RecordRepository`, whose
//! one implementation is `crate::recording`'s. Every write runs in a write transaction.

use sqlx::{QueryBuilder, Sqlite};

use super::SqliteStore;
use super::reads::insert_charge_writes;
use crate::StoreError;
use crate::claiming::NewClaim;
use crate::fenced;
use crate::model::{Claim, Completion};
use crate::recording::{ChargeFinish, impl_record_repository};

impl SqliteStore {
    /// The insert, the read and the decision run in one `BEGIN IMMEDIATE` transaction: the
    /// write lock is held from the first statement, so no other claim can interleave. Replays,
    /// 409s and 422s never get here: the lock-free read of `RecordRepository::claim` answers
    /// them without the write lock.
    async fn claim_under_lock(&self, claim: NewClaim<'_>) -> Result<Claim, StoreError> {
        let mut write = self.begin_write().await?;
        if let Some(claimed) = self.insert_pending(&mut write, &claim).await? {
            write.commit().await?;
            return Ok(Claim::Owned(claimed));
        }
        let corrupt = |what: &str| StoreError::Corrupt(format!("key {} {what}", claim.key));
        let found = Self::read_record(&mut write, claim.scope, claim.key, false)
            .await?
            .ok_or_else(|| corrupt("neither inserts nor reads back"))?;
        // Under the write lock the record read just now cannot be absent.
        let outcome = self
            .act_on_locked(&mut write, found, &claim)
            .await?
            .ok_or_else(|| corrupt("exists but was judged absent"))?;
        write.commit().await?;
        Ok(outcome)
    }

    /// Runs one write statement (a fenced write, a prune) in a write transaction of its own,
    /// and returns the rows it changed.
    pub(super) async fn write_statement(
        &self,
        mut sql: QueryBuilder<'_, Sqlite>,
    ) -> Result<u64, StoreError> {
        let mut write = self.begin_write().await?;
        let done = sql.build().execute(&mut *write).await?;
        write.commit().await?;
        Ok(done.rows_affected())
    }

    /// Runs one completing statement (`RETURNING expires_at`) in a write transaction.
    async fn write_completion(
        &self,
        mut sql: QueryBuilder<'_, Sqlite>,
    ) -> Result<Completion, StoreError> {
        let mut write = self.begin_write().await?;
        let completion = Self::complete_on(&mut write, &mut sql).await?;
        write.commit().await?;
        Ok(completion)
    }

    /// The fenced completion of the record gates the inserts: when it matches no row, the
    /// transaction is dropped (rolled back) having written nothing.
    pub(crate) async fn write_charge(
        &self,
        finish: ChargeFinish<'_>,
    ) -> Result<Completion, StoreError> {
        let ttl = self.policy.ttl;
        let mut sql = fenced::complete(finish.owner, finish.response, ttl)?;
        let mut write = self.begin_write().await?;
        let completion = Self::complete_on(&mut write, &mut sql).await?;
        if completion == Completion::Fenced {
            return Ok(Completion::Fenced);
        }
        insert_charge_writes(&mut write, finish.charge).await?;
        write.commit().await?;
        Ok(completion)
    }
}

impl_record_repository!(SqliteStore, sqlx::Sqlite);
