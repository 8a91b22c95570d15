//! `WorkerRepository`, written once for both backends over any [`SqlStore`]: the completer's
//! takeover of abandoned records and the reaper's deletion of expired ones, the same SQL on
//! PostgreSQL and SQLite but for the clock and `SKIP LOCKED` ([`Dialect`]). The outbox relay
//! takes its rows each backend's own way (`SqlStore::relay`, in its `relay.rs`).

use std::time::Duration;

use async_trait::async_trait;

use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::model::Abandoned;
use crate::repository::WorkerRepository;
use crate::rows::AbandonedRow;
use crate::sql_store::SqlStore;
use crate::stream::{EventSink, RelayError};

/// The statement that takes over one pending record that `condition` (pushed after
/// `state = 'pending' AND `, and free to end with an `ORDER BY`) picks: it bumps `attempts`, so
/// the attempt that held the record, if it is merely slow rather than dead, is fenced off, and
/// locks the record for `lock_timeout`. The completer's takeover and reconciliation's share it.
pub(crate) fn take_over<'a, DB: Dialect>(
    lock_timeout: Duration,
    condition: impl FnOnce(&mut Statement<'a, DB>),
) -> Statement<'a, DB> {
    let mut sql = Statement::<DB>::new(
        "UPDATE idempotency_records SET attempts = attempts + 1, locked_until = ",
    );
    DB::push_now_plus(&mut sql, lock_timeout);
    sql.push(", updated_at = ").push(DB::NOW).push(
        " WHERE (tenant_id, operation, idempotency_key) IN (
             SELECT tenant_id, operation, idempotency_key FROM idempotency_records
             WHERE state = 'pending' AND ",
    );
    condition(&mut sql);
    sql.push(" LIMIT 1").push(DB::SKIP_LOCKED).push(
        ") RETURNING tenant_id, operation, idempotency_key, attempts, resource_id,
               processor_key, recovery_point, effect_id, request_body, request_version",
    );
    sql
}

#[async_trait]
impl<S: SqlStore> WorkerRepository for S {
    /// Takes over the pending record whose lock ended longest ago, if it ended at least
    /// `settle_after` ago, in one statement.
    ///
    /// One record at a time: the completer settles it before it takes the next, so no record
    /// sits locked in a batch while its lock runs out. On PostgreSQL, `FOR UPDATE SKIP LOCKED`
    /// lets every instance run a completer at once: each takes a different row, and none waits
    /// for another; on SQLite the write lock lets one completer in at a time. The takeover
    /// bumps `attempts`, so the original attempt, if it is merely slow rather than dead, is
    /// fenced off.
    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreError> {
        let sql = take_over::<S::Db>(self.policy().lock_timeout, |sql| {
            sql.push("locked_until < ");
            S::Db::push_now_minus(sql, settle_after);
            sql.push(" ORDER BY locked_until");
        });
        let row: Option<AbandonedRow> = self.write_one_returning(sql).await?;
        row.map(AbandonedRow::into_abandoned).transpose()
    }

    /// Deletes up to `batch` expired completed or failed records, the longest expired first,
    /// and returns how many.
    ///
    /// Pending records are never reaped, however old: the card may have been charged, and only
    /// a resume or the completer may settle them. Nor is a failed record that holds an effect
    /// id: a known effect is never dropped. The guard reads only the record, never an
    /// operation's tables: a completed record holding an effect id was completed by its
    /// operation's finish, in the transaction that wrote the effect's rows (the completion
    /// without an effect, `fenced::complete_without_effect`, matches no record that holds
    /// one), so its rows exist. `SKIP LOCKED` keeps the reaper out of the way of requests and
    /// of other reapers; on SQLite, one batch per write transaction keeps a request waiting
    /// for one batch at most.
    ///
    /// The `ORDER BY expires_at` makes every batch a walk along the partial index
    /// `idempotency_records_expiry` (finished records by expiry) that stops after `batch` rows,
    /// whatever the statistics say. Without it, once most of the table is expired (a bulk
    /// expiry, or reapers stopped for a while) PostgreSQL's planner takes a sequential scan
    /// for the `LIMIT`, and the last batch, which finds nothing, reads the whole heap: 0.2 to
    /// 3 s at 1,000,000 records, against milliseconds along the index (docs/BENCHMARKS.md).
    async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let mut sql = Statement::<S::Db>::new(
            "DELETE FROM idempotency_records
             WHERE (tenant_id, operation, idempotency_key) IN (
                 SELECT tenant_id, operation, idempotency_key FROM idempotency_records
                 WHERE state <> 'pending' AND expires_at <= ",
        );
        sql.push(S::Db::NOW).push(
            " AND (effect_id IS NULL OR state = 'completed')
                 ORDER BY expires_at
                 LIMIT ",
        );
        sql.value(batch).push(S::Db::SKIP_LOCKED).push(")");
        self.write_one(sql).await
    }

    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        self.relay(batch, sink).await
    }
}
