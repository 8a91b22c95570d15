//! The records of the idempotency protocol on PostgreSQL: what differs from SQLite in
//! `RecordRepository`, whose one implementation is `crate::recording`'s.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, QueryBuilder};

use super::PgStore;
use super::statements::push_charge_writes;
use crate::StoreError;
use crate::claiming::NewClaim;
use crate::fenced;
use crate::model::{Claim, Completion};
use crate::recording::{ChargeFinish, impl_record_repository};

impl PgStore {
    /// Claims a key under the lock (the lock-free read that answers replays, 409s and 422s
    /// comes first, in `RecordRepository::claim`).
    ///
    /// A fresh key is claimed by a single `INSERT .. ON CONFLICT DO NOTHING`: the primary key
    /// decides between concurrent duplicates, with no check-then-act window. Only when the key
    /// exists does the claim read the record under `FOR UPDATE` and judge it, in one short
    /// transaction, so that two retries cannot both take over a stale record.
    async fn claim_under_lock(&self, claim: NewClaim<'_>) -> Result<Claim, StoreError> {
        // Two rounds at most: the record can vanish (reaped) between the failed insert and the
        // locking read, and then the insert is tried once more.
        for _ in 0..2 {
            let mut conn = self.pool.acquire().await?;
            if let Some(claimed) = self.insert_pending(&mut conn, &claim).await? {
                return Ok(Claim::Owned(claimed));
            }
            drop(conn);
            let mut tx = self.begin().await?;
            let Some(locked) = Self::read_record(&mut tx, claim.scope, claim.key, true).await?
            else {
                continue;
            };
            // Judged absent: the record vanished in between; try the insert again.
            let Some(outcome) = self.act_on_locked(&mut tx, locked, &claim).await? else {
                continue;
            };
            tx.commit().await?;
            return Ok(outcome);
        }
        Err(StoreError::Corrupt(format!(
            "key {} neither inserts nor reads back",
            claim.key
        )))
    }

    /// Runs one write statement (a fenced write, a prune) on the pool, in a transaction of its
    /// own, and returns the rows it changed.
    pub(super) async fn write_statement(
        &self,
        mut sql: QueryBuilder<'_, Postgres>,
    ) -> Result<u64, StoreError> {
        Ok(sql.build().execute(&self.pool).await?.rows_affected())
    }

    /// Runs one completing statement (`RETURNING expires_at`) on the pool.
    async fn write_completion(
        &self,
        mut sql: QueryBuilder<'_, Postgres>,
    ) -> Result<Completion, StoreError> {
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
    pub(crate) async fn write_charge(
        &self,
        finish: ChargeFinish<'_>,
    ) -> Result<Completion, StoreError> {
        let ttl = self.policy.ttl;
        let mut sql = QueryBuilder::new("WITH gate AS (");
        fenced::push_complete(&mut sql, finish.owner, finish.response, ttl)?;
        sql.push("), ");
        push_charge_writes(&mut sql, finish.charge)?;
        sql.push(" SELECT expires_at FROM gate");
        self.write_completion(sql).await
    }
}

impl_record_repository!(PgStore, sqlx::Postgres);
