//! The outbox relay on SQLite: rows leased, published, then marked.

use std::time::Duration;

use sqlx::Sqlite;
use uuid::Uuid;

use super::SqliteStore;
use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::stream::{EventSink, OutboxEvent, RelayError};

/// How long a relay may hold events it is publishing before another relay may take them.
const RELAY_LEASE: Duration = Duration::from_secs(10);

impl SqliteStore {
    /// Leases a batch, publishes it, then marks it published. The write lock is not held
    /// across the publish (a slow Redis must not stop every writer): the lease keeps relays in
    /// other processes off these rows meanwhile, as `SKIP LOCKED` does on PostgreSQL. If the
    /// publish fails the lease is given back at once; if this process dies, it runs out.
    pub(super) async fn relay_outbox_leased(
        &self,
        batch: i64,
        sink: &dyn EventSink,
    ) -> Result<usize, RelayError> {
        let mut lease = Statement::<Sqlite>::new("UPDATE outbox_events SET relay_lease_until = ");
        Sqlite::push_now_plus(&mut lease, RELAY_LEASE);
        lease.push(
            " WHERE rowid IN (SELECT rowid FROM outbox_events
                             WHERE published_at IS NULL
                               AND (relay_lease_until IS NULL OR relay_lease_until < ",
        );
        lease.push(Sqlite::NOW).push(
            ") ORDER BY created_at
                             LIMIT ",
        );
        lease
            .value(batch)
            .push(") RETURNING id, event_type, payload, created_at");
        let mut leased: Vec<(Uuid, String, String, String)> = {
            // Scoped: the write gate must be released before the publish and the settle.
            let mut write = self.begin_immediate().await?;
            let rows = lease
                .fetch_all(&mut write)
                .await
                .map_err(StoreError::from)?;
            write.commit().await.map_err(StoreError::from)?;
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
        let mut write = self.begin_immediate().await?;
        for event in &events {
            let mut settle = Statement::<Sqlite>::new("UPDATE outbox_events SET ");
            if published.is_ok() {
                settle.push("published_at = ").push(Sqlite::NOW).push(", ");
            }
            settle
                .push("relay_lease_until = NULL WHERE id = ")
                .value(event.id);
            settle.execute(&mut write).await.map_err(StoreError::from)?;
        }
        write.commit().await.map_err(StoreError::from)?;
        published?;
        Ok(events.len())
    }
}
