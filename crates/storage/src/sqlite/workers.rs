//! What the background workers need, on SQLite.

use async_trait::async_trait;
use uuid::Uuid;

use std::time::Duration;

use super::{NOW, SqliteStore, now_plus, offset};
use crate::StoreError;
use crate::model::Abandoned;
use crate::repository::WorkerRepository;
use crate::rows::AbandonedRow;
use crate::stream::{EventSink, OutboxEvent, RelayError};

/// How long a relay may hold events it is publishing before another relay may take them.
const RELAY_LEASE: Duration = Duration::from_secs(10);

#[async_trait]
impl WorkerRepository for SqliteStore {
    /// One statement under the write lock selects and takes over the stalest record, so two
    /// completers (in one process or several) can never take the same one.
    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET attempts = attempts + 1, locked_until = {}, updated_at = {NOW}
             WHERE rowid IN (SELECT rowid FROM idempotency_records
                             WHERE state = 'pending' AND locked_until < {}
                             ORDER BY locked_until
                             LIMIT 1)
             RETURNING tenant_id, operation, idempotency_key, attempts, resource_id,
                       processor_key, recovery_point, effect_id, request_body",
            now_plus("?1"),
            now_plus("?2"),
        );
        let mut write = self.begin_write().await?;
        let row: Option<AbandonedRow> = sqlx::query_as(&sql)
            .bind(offset(self.policy.lock_timeout))
            .bind(format!("-{:.3} seconds", settle_after.as_secs_f64()))
            .fetch_optional(&mut *write.tx)
            .await?;
        write.commit().await?;
        row.map(AbandonedRow::into_abandoned).transpose()
    }

    /// One batch per write transaction, so a request waits for one batch at most. The
    /// `ORDER BY expires_at` walks the partial index `idempotency_records_expiry` in order and
    /// stops after `batch` rows (the index gives the order, so nothing is sorted), however much
    /// of the table is expired. The guard is PostgreSQL's: it reads only the record.
    async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let sql = format!(
            "DELETE FROM idempotency_records
             WHERE rowid IN (SELECT rowid FROM idempotency_records r
                             WHERE state <> 'pending' AND expires_at <= {NOW}
                               AND (effect_id IS NULL OR state = 'completed')
                             ORDER BY expires_at
                             LIMIT ?1)"
        );
        let mut write = self.begin_write().await?;
        let done = sqlx::query(&sql)
            .bind(batch)
            .execute(&mut *write.tx)
            .await?;
        write.commit().await?;
        Ok(done.rows_affected())
    }

    /// Leases a batch, publishes it, then marks it published. The write lock is not held
    /// across the publish (a slow Redis must not stop every writer): the lease keeps relays in
    /// other processes off these rows meanwhile, as `SKIP LOCKED` does on PostgreSQL. If the
    /// publish fails the lease is given back at once; if this process dies, it runs out.
    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        let lease = format!(
            "UPDATE outbox_events SET relay_lease_until = {}
             WHERE rowid IN (SELECT rowid FROM outbox_events
                             WHERE published_at IS NULL
                               AND (relay_lease_until IS NULL OR relay_lease_until < {NOW})
                             ORDER BY created_at
                             LIMIT ?2)
             RETURNING id, event_type, payload, created_at",
            now_plus("?1"),
        );
        let mut leased: Vec<(Uuid, String, String, String)> = {
            // Scoped: the write gate must be released before the publish and the settle.
            let mut write = self.begin_write().await?;
            let rows = sqlx::query_as(&lease)
                .bind(offset(RELAY_LEASE))
                .bind(batch)
                .fetch_all(&mut *write.tx)
                .await
                .map_err(StoreError::from)?;
            write.commit().await?;
            rows
        };
        if leased.is_empty() {
            return Ok(0);
        }
        // RETURNING has no order: publish in the order the events were written.
        leased.sort_by(|a, b| a.3.cmp(&b.3));
        let events: Vec<OutboxEvent> = leased
            .into_iter()
            .map(|(id, event_type, payload, _)| OutboxEvent {
                id,
                event_type,
                payload,
            })
            .collect();
        let published = sink.publish(&events).await;
        let settle = match published {
            Ok(()) => format!(
                "UPDATE outbox_events SET published_at = {NOW}, relay_lease_until = NULL
                 WHERE id = ?1"
            ),
            Err(_) => "UPDATE outbox_events SET relay_lease_until = NULL WHERE id = ?1".to_owned(),
        };
        let mut write = self.begin_write().await?;
        for event in &events {
            sqlx::query(&settle)
                .bind(event.id)
                .execute(&mut *write.tx)
                .await
                .map_err(StoreError::from)?;
        }
        write.commit().await?;
        published?;
        Ok(events.len())
    }
}
