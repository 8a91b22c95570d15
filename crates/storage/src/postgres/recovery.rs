//! What the background workers need: abandoned records to complete, expired ones to delete.

use super::{PgStore, secs};
use crate::StoreError;
use crate::model::Abandoned;
use crate::rows::AbandonedRow;

impl PgStore {
    /// Takes over up to `limit` pending records whose lock has expired, in one statement.
    ///
    /// `FOR UPDATE SKIP LOCKED` lets every instance run a completer at once: each takes
    /// different rows, and none waits for another. The takeover bumps `attempts`, so the
    /// original attempt, if it is merely slow rather than dead, is fenced off.
    pub(crate) async fn take_over_abandoned(
        &self,
        limit: i64,
    ) -> Result<Vec<Abandoned>, StoreError> {
        let rows: Vec<AbandonedRow> = sqlx::query_as(
            "UPDATE idempotency_records r
             SET attempts = r.attempts + 1, locked_until = now() + make_interval(secs => $1),
                 updated_at = now()
             FROM (SELECT tenant_id, operation, idempotency_key FROM idempotency_records
                   WHERE state = 'pending' AND locked_until < now()
                   ORDER BY locked_until
                   LIMIT $2
                   FOR UPDATE SKIP LOCKED) stale
             WHERE r.tenant_id = stale.tenant_id AND r.operation = stale.operation
               AND r.idempotency_key = stale.idempotency_key
             RETURNING r.tenant_id, r.operation, r.idempotency_key, r.attempts, r.resource_id,
                       r.processor_key, r.recovery_point, r.processor_charge_id, r.request_body",
        )
        .bind(secs(self.policy.lock_timeout))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(AbandonedRow::into_abandoned).collect()
    }

    /// Deletes up to `batch` expired completed or failed records and returns how many.
    ///
    /// Pending records are never reaped, however old: the card may have been charged, and only
    /// a resume or the completer may settle them. Small batches keep each statement short, and
    /// `SKIP LOCKED` keeps the reaper out of the way of requests and of other reapers.
    pub(crate) async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idempotency_records
             WHERE (tenant_id, operation, idempotency_key) IN (
                 SELECT tenant_id, operation, idempotency_key FROM idempotency_records
                 WHERE state <> 'pending' AND expires_at <= now()
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)",
        )
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
