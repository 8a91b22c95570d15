//! What the background workers need, on SQLite.

use async_trait::async_trait;
use payments_idempotency::{Attempt, IdempotencyKey, Scope};
use uuid::Uuid;

use super::{NOW, SqliteStore, now_plus, offset};
use crate::StoreError;
use crate::model::{Abandoned, Backlog};
use crate::repository::WorkerRepository;
use crate::stream::{EventStream, OutboxEvent, RelayError};

#[derive(Debug, sqlx::FromRow)]
struct AbandonedRow {
    tenant_id: String,
    operation: String,
    idempotency_key: String,
    attempts: i32,
    resource_id: Uuid,
    processor_key: String,
    recovery_point: String,
    processor_charge_id: Option<String>,
    request_body: Option<Vec<u8>>,
}

#[async_trait]
impl WorkerRepository for SqliteStore {
    /// One statement under the write lock selects and takes over the stale records, so two
    /// completers (in one process or several) can never take the same one.
    async fn take_over_abandoned(&self, limit: i64) -> Result<Vec<Abandoned>, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET attempts = attempts + 1, locked_until = {}, updated_at = {NOW}
             WHERE rowid IN (SELECT rowid FROM idempotency_records
                             WHERE state = 'pending' AND locked_until < {NOW}
                             ORDER BY locked_until
                             LIMIT ?2)
             RETURNING tenant_id, operation, idempotency_key, attempts, resource_id,
                       processor_key, recovery_point, processor_charge_id, request_body",
            now_plus("?1"),
        );
        let mut write = self.begin_write().await?;
        let rows: Vec<AbandonedRow> = sqlx::query_as(&sql)
            .bind(offset(self.policy.lock_timeout))
            .bind(limit)
            .fetch_all(&mut *write.tx)
            .await?;
        write.tx.commit().await?;
        rows.into_iter()
            .map(|row| {
                Ok(Abandoned {
                    key: IdempotencyKey::parse(&row.idempotency_key)
                        .map_err(|e| StoreError::Corrupt(format!("idempotency_key: {e}")))?,
                    scope: Scope {
                        tenant: row.tenant_id,
                        operation: row.operation,
                    },
                    attempt: Attempt(row.attempts),
                    resource_id: row.resource_id,
                    processor_key: row.processor_key,
                    recovery_point: row.recovery_point.parse().map_err(|_| {
                        StoreError::Corrupt(format!("recovery_point = {:?}", row.recovery_point))
                    })?,
                    processor_charge_id: row.processor_charge_id,
                    request_body: row.request_body,
                })
            })
            .collect()
    }

    async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let sql = format!(
            "DELETE FROM idempotency_records
             WHERE rowid IN (SELECT rowid FROM idempotency_records
                             WHERE state <> 'pending' AND expires_at <= {NOW}
                             LIMIT ?1)"
        );
        let mut write = self.begin_write().await?;
        let done = sqlx::query(&sql)
            .bind(batch)
            .execute(&mut *write.tx)
            .await?;
        write.tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// Reads a batch, publishes it, then marks it. The write lock is not held across the
    /// publish (a slow Redis must not stop every writer), so two processes relaying one file
    /// may publish an event twice: delivery is at least once either way, and `event_id` lets
    /// consumers drop the duplicate.
    async fn relay_outbox(&self, batch: i64, stream: &EventStream) -> Result<usize, RelayError> {
        let events: Vec<OutboxEvent> = sqlx::query_as(
            "SELECT id, event_type, payload FROM outbox_events
             WHERE published_at IS NULL
             ORDER BY created_at
             LIMIT ?1",
        )
        .bind(batch)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::from)?;
        if events.is_empty() {
            return Ok(0);
        }
        stream.publish(&events).await?;
        let mut write = self.begin_write().await?;
        for event in &events {
            sqlx::query(&format!(
                "UPDATE outbox_events SET published_at = {NOW} WHERE id = ?1"
            ))
            .bind(event.id)
            .execute(&mut *write.tx)
            .await
            .map_err(StoreError::from)?;
        }
        write.tx.commit().await.map_err(StoreError::from)?;
        Ok(events.len())
    }

    async fn outbox_backlog(&self) -> Result<Backlog, StoreError> {
        let (unpublished, oldest_age_secs): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), (julianday('now') - julianday(min(created_at))) * 86400.0
             FROM outbox_events WHERE published_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            unpublished,
            oldest_age_secs: oldest_age_secs.unwrap_or(0.0),
        })
    }
}
