//! The outbox relay on PostgreSQL: rows locked for the round, published, then marked.

use sqlx::Postgres;
use uuid::Uuid;

use super::PgStore;
use crate::StoreError;
use crate::dialect::{Statement, answered};
use crate::stream::{EventSink, OutboxEvent, RelayError};

impl PgStore {
    /// Publishes up to `batch` unpublished events and marks them published; returns how many.
    ///
    /// The rows are locked with `FOR UPDATE SKIP LOCKED` for the round, so relays on several
    /// instances take disjoint rows and never publish one row twice between them. The rows are
    /// marked only after the stream accepted them, in the same transaction: if Redis fails they
    /// stay unpublished for the next round; if the commit fails after the XADD, the next round
    /// publishes them again (at least once, never lost).
    pub(super) async fn relay_outbox_locked(
        &self,
        batch: i64,
        sink: &dyn EventSink,
    ) -> Result<usize, RelayError> {
        let mut tx = self.begin().await?;
        let mut select = Statement::<Postgres>::new(
            "SELECT id, event_type, payload::text AS payload FROM outbox_events
             WHERE published_at IS NULL
             ORDER BY created_at
             LIMIT ",
        );
        select.value(batch).push(" FOR UPDATE SKIP LOCKED");
        let events: Vec<OutboxEvent> = select.fetch_all(&mut tx).await.map_err(StoreError::from)?;
        if events.is_empty() {
            return Ok(0);
        }
        sink.publish(&events).await?;
        let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
        let mut mark = Statement::<Postgres>::new(
            "UPDATE outbox_events SET published_at = now() WHERE id = ANY(",
        );
        mark.value(ids).push(")");
        mark.execute(&mut tx).await.map_err(StoreError::from)?;
        answered::<Postgres, _>(tx.commit())
            .await
            .map_err(StoreError::from)?;
        Ok(events.len())
    }
}
