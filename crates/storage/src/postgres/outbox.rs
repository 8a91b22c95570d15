//! The PostgreSQL outbox relay: unpublished `outbox_events` rows go to the stream, at least once;
//! published rows are pruned after their retention.

use std::time::Duration;

use uuid::Uuid;

use super::{PgStore, secs};
use crate::StoreError;
use crate::model::Backlog;
use crate::stream::{EventSink, OutboxEvent, RelayError};

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
        sink: &dyn EventSink,
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

    /// Deletes up to `batch` rows published more than `retention` ago and returns how many.
    ///
    /// `published_at IS NOT NULL` is spelled out although the comparison implies it: an
    /// unpublished row must never go, however old. `SKIP LOCKED` keeps the reapers of several
    /// instances on disjoint rows; the index `outbox_events_published` finds the old rows
    /// without reading the whole table.
    pub(crate) async fn prune_published_events(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM outbox_events
             WHERE id IN (
                 SELECT id FROM outbox_events
                 WHERE published_at IS NOT NULL
                   AND published_at < now() - make_interval(secs => $1)
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED)",
        )
        .bind(secs(retention))
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
