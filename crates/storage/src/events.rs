//! `EventRepository`: the events feed (`GET /events`), read from the outbox, always within one
//! tenant. Each backend orders the feed so that what a reader can see is always a prefix of
//! what it will ever see (each backend's migration `event_feed` says how), so that a client
//! paging with `starting_after` never skips an event that commits after it read a page, and
//! never sees one twice. On PostgreSQL, where commit order is not insertion order, the feed
//! keeps back the rows an older transaction still in flight could yet precede.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{EventId, EventType, TenantId};
use uuid::Uuid;

use crate::StoreError;
use crate::database::DatabaseStore;
use crate::rows::page;
use crate::sql::{Each, Sql};

/// The events feed (`GET /events`), from the outbox (`events.rs`), always within one tenant.
#[async_trait]
pub trait EventRepository: Send + Sync {
    /// The tenant's event with this id; another tenant's is simply not found.
    async fn get_event(
        &self,
        tenant: &TenantId,
        id: EventId,
    ) -> Result<Option<StoredEvent>, StoreError>;

    /// A page of the tenant's events, oldest first, or `None` when the cursor is not one of
    /// its events. What a reader sees is always a prefix of the feed: an event that commits
    /// later is never placed before one already shown.
    async fn list_events(
        &self,
        tenant: &TenantId,
        page: ListEvents,
    ) -> Result<Option<EventPage>, StoreError>;
}

/// A page request of a tenant's events: oldest first, after an optional cursor, of one type
/// or of all.
#[derive(Debug, Clone, Copy)]
pub struct ListEvents {
    pub limit: u32,
    pub starting_after: Option<EventId>,
    pub event_type: Option<EventType>,
}

/// An event as the outbox keeps it: its payload is what the stream entry carries.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub id: EventId,
    pub event_type: EventType,
    pub payload: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// One page of events, oldest first.
#[derive(Debug, Clone)]
pub struct EventPage {
    pub events: Vec<StoredEvent>,
    pub has_more: bool,
}

/// An `outbox_events` row as the events feed reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    pub id: Uuid,
    pub event_type: String,
    pub payload: String,
    pub created_at: DateTime<Utc>,
}

impl EventRow {
    pub(crate) fn into_event(self) -> Result<StoredEvent, StoreError> {
        Ok(StoredEvent {
            id: EventId::from_uuid(self.id),
            event_type: EventType::from_name(&self.event_type)
                .ok_or_else(|| StoreError::Corrupt(format!("event_type: {:?}", self.event_type)))?,
            payload: serde_json::from_str(&self.payload)
                .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?,
            created_at: self.created_at,
        })
    }
}

/// A page of events, like [`charge_page`].
fn event_page(rows: Vec<EventRow>, limit: u32) -> Result<EventPage, StoreError> {
    let (events, has_more) = page(rows, limit, EventRow::into_event)?;
    Ok(EventPage { events, has_more })
}

/// The tenant's event with this id, whether or not the feed shows it yet. The payload is read
/// as text on both backends (PostgreSQL keeps it as jsonb).
const EVENT: &str = "
SELECT id, event_type, CAST(payload AS TEXT) AS payload, created_at FROM outbox_events
WHERE tenant_id = $1 AND id = $2";

/// The first `$3` of the tenant's events in feed order, of type `$2` (or of every type when it
/// is `NULL`).
const EVENTS: Each = Each {
    postgres: "
SELECT id, event_type, CAST(payload AS TEXT) AS payload, created_at FROM outbox_events
WHERE tenant_id = $1 AND ($2 IS NULL OR event_type = $2)
  AND writer_xact < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY writer_xact, position LIMIT $3",
    sqlite: "
SELECT id, event_type, CAST(payload AS TEXT) AS payload, created_at FROM outbox_events
WHERE tenant_id = $1 AND ($2 IS NULL OR event_type = $2)
ORDER BY position LIMIT $3",
};

/// The same, after the event `$3`.
const EVENTS_AFTER: Each = Each {
    postgres: "
SELECT id, event_type, CAST(payload AS TEXT) AS payload, created_at FROM outbox_events
WHERE tenant_id = $1 AND ($2 IS NULL OR event_type = $2)
  AND writer_xact < pg_snapshot_xmin(pg_current_snapshot())
  AND (writer_xact, position) > (SELECT writer_xact, position FROM outbox_events WHERE id = $3)
ORDER BY writer_xact, position LIMIT $4",
    sqlite: "
SELECT id, event_type, CAST(payload AS TEXT) AS payload, created_at FROM outbox_events
WHERE tenant_id = $1 AND ($2 IS NULL OR event_type = $2)
  AND position > (SELECT position FROM outbox_events WHERE id = $3)
ORDER BY position LIMIT $4",
};

#[async_trait]
impl EventRepository for DatabaseStore {
    async fn get_event(
        &self,
        tenant: &TenantId,
        id: EventId,
    ) -> Result<Option<StoredEvent>, StoreError> {
        let mut connection = self.acquire().await?;
        let row: Option<EventRow> = Sql::new(EVENT)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&mut connection.connection())
            .await?;
        row.map(EventRow::into_event).transpose()
    }

    /// Up to `limit` + 1 of the tenant's events in feed order: the row more than asked tells
    /// whether another page exists.
    async fn list_events(
        &self,
        tenant: &TenantId,
        page: ListEvents,
    ) -> Result<Option<EventPage>, StoreError> {
        let event_type = page.event_type.map(|kind| kind.name());
        let sql = match page.starting_after {
            None => Sql::new(EVENTS).bind(tenant.as_str()).bind(event_type),
            Some(cursor) => {
                if self.get_event(tenant, cursor).await?.is_none() {
                    return Ok(None);
                }
                Sql::new(EVENTS_AFTER)
                    .bind(tenant.as_str())
                    .bind(event_type)
                    .bind(cursor.as_uuid())
            }
        };
        let mut connection = self.acquire().await?;
        let rows = sql
            .bind(i64::from(page.limit) + 1)
            .fetch_all(&mut connection.connection())
            .await?;
        event_page(rows, page.limit).map(Some)
    }
}
