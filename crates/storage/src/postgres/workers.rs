//! What the background workers need: abandoned records to settle, expired ones to delete,
//! and the outbox relay, which publishes unpublished `outbox_events` rows at least once and
//! prunes published ones after their retention.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::{PgStore, secs};
use crate::StoreError;
use crate::model::Abandoned;
use crate::repository::WorkerRepository;
use crate::rows::AbandonedRow;
use crate::stream::{EventSink, OutboxEvent, RelayError};

#[async_trait]
impl WorkerRepository for PgStore {
    /// Takes over the pending record whose lock ended longest ago, if it ended at least
    /// `settle_after` ago, in one statement.
    ///
    /// One record at a time: the completer settles it before it takes the next, so no record
    /// sits locked in a batch while its lock runs out. `FOR UPDATE SKIP LOCKED` lets every
    /// instance run a completer at once: each takes a different row, and none waits for
    /// another. The takeover bumps `attempts`, so the original attempt, if it is merely slow
    /// rather than dead, is fenced off.
    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreError> {
        let row: Option<AbandonedRow> = sqlx::query_as(
            "UPDATE idempotency_records r
             SET attempts = r.attempts + 1, locked_until = now() + make_interval(secs => $1),
                 updated_at = now()
             FROM (SELECT tenant_id, operation, idempotency_key FROM idempotency_records
                   WHERE state = 'pending'
                     AND locked_until < now() - make_interval(secs => $2)
                   ORDER BY locked_until
                   LIMIT 1
                   FOR UPDATE SKIP LOCKED) stale
             WHERE r.tenant_id = stale.tenant_id AND r.operation = stale.operation
               AND r.idempotency_key = stale.idempotency_key
             RETURNING r.tenant_id, r.operation, r.idempotency_key, r.attempts, r.resource_id,
                       r.processor_key, r.recovery_point, r.effect_id, r.request_body",
        )
        .bind(secs(self.policy.lock_timeout))
        .bind(secs(settle_after))
        .fetch_optional(&self.pool)
        .await?;
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
    /// one), so its rows exist. `SKIP LOCKED`
    /// keeps the reaper out of the way of requests and of other reapers.
    ///
    /// The `ORDER BY expires_at` makes every batch a walk along the partial index
    /// `idempotency_records_expiry` (finished records by expiry) that stops after `batch` rows,
    /// whatever the statistics say. Without it, once most of the table is expired (a bulk
    /// expiry, or reapers stopped for a while) the planner takes a sequential scan for the
    /// `LIMIT`, and the last batch, which finds nothing, reads the whole heap: 0.2 to 3 s at
    /// 1,000,000 records, against milliseconds along the index (docs/BENCHMARKS.md).
    async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idempotency_records
             WHERE (tenant_id, operation, idempotency_key) IN (
                 SELECT tenant_id, operation, idempotency_key FROM idempotency_records r
                 WHERE state <> 'pending' AND expires_at <= now()
                   AND (effect_id IS NULL OR state = 'completed')
                 ORDER BY expires_at
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)",
        )
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Publishes up to `batch` unpublished events and marks them published; returns how many.
    ///
    /// The rows are locked with `FOR UPDATE SKIP LOCKED` for the round, so relays on several
    /// instances take disjoint rows and never publish one row twice between them. The rows are
    /// marked only after the stream accepted them, in the same transaction: if Redis fails they
    /// stay unpublished for the next round; if the commit fails after the XADD, the next round
    /// publishes them again (at least once, never lost).
    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        let mut tx = self.begin().await?;
        let events: Vec<OutboxEvent> = sqlx::query_as(
            "SELECT id, event_type, payload::text AS payload FROM outbox_events
             WHERE published_at IS NULL
             ORDER BY created_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        if events.is_empty() {
            return Ok(0);
        }
        sink.publish(&events).await?;
        let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
        sqlx::query("UPDATE outbox_events SET published_at = now() WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(events.len())
    }
}
