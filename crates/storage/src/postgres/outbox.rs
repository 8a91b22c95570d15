//! The PostgreSQL outbox relay: unpublished `outbox_events` rows go to the stream, at least once.

use uuid::Uuid;

use super::PgStore;
use crate::StoreError;
use crate::model::Backlog;
use crate::stream::{EventStream, OutboxEvent, RelayError};

impl PgStore {
    /// Publishes up to `batch` unpublished events and marks them published; returns how many.
    ///
    /// The rows are locked with `FOR UPDATE SKIP LOCKED` for the round, so relays on several
    /// instances take disjoint rows and never publish one row twice between them. The rows are
    /// marked only after the stream accepted them, in the same transaction: if Redis fails they
    /// stay unpublished for the next round; if the commit fails after the XADD, the next round
    /// publishes them again (at least once, never lost).
    pub(crate) async fn relay_outbox(
        &self,
        batch: i64,
        stream: &EventStream,
    ) -> Result<usize, RelayError> {
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
        stream.publish(&events).await?;
        let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
        sqlx::query("UPDATE outbox_events SET published_at = now() WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(events.len())
    }

    /// The size and age of the unpublished backlog.
    pub(crate) async fn outbox_backlog(&self) -> Result<Backlog, StoreError> {
        let (unpublished, oldest_age_secs): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
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
