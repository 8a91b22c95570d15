//! `EventRepository`, written once for both backends over any [`SqlStore`]: the events feed
//! (`GET /events`), read from the outbox, always within one tenant. The order is the backend's
//! [`Dialect::EVENT_FEED_ORDER`], in which what a reader can see is always a prefix of what it
//! will ever see, so that a client paging with `starting_after` never skips an event that
//! commits after it read a page, and never sees one twice.

use async_trait::async_trait;
use payments_domain::{EventId, TenantId};

use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::model::{EventPage, ListEvents, StoredEvent};
use crate::reading::push_tenants_id;
use crate::repository::EventRepository;
use crate::rows::{self, EventRow};
use crate::sql_store::SqlStore;

/// The payload as text on both backends (PostgreSQL keeps it as jsonb).
const SELECT_EVENTS: &str =
    "SELECT id, event_type, CAST(payload AS TEXT) AS payload, created_at FROM outbox_events";

/// The tenant's event with this id, whether or not the feed shows it yet.
fn event<'a, DB: Dialect>(tenant: &'a TenantId, id: EventId) -> Statement<'a, DB> {
    let mut sql = Statement::new(SELECT_EVENTS);
    push_tenants_id(&mut sql, tenant, id.as_uuid());
    sql
}

/// Up to `limit` + 1 of the tenant's events in feed order, after the event `starting_after`
/// (which the caller has found to be the tenant's), of one type or of all. The row more than
/// asked tells whether another page exists.
fn events_after<'a, DB: Dialect>(tenant: &'a TenantId, page: ListEvents) -> Statement<'a, DB> {
    let mut sql = Statement::new(SELECT_EVENTS);
    sql.push(" WHERE tenant_id = ").value(tenant.as_str());
    if let Some(kind) = page.event_type {
        sql.push(" AND event_type = ").value(kind.name());
    }
    sql.push(DB::EVENT_FEED_SETTLED);
    if let Some(cursor) = page.starting_after {
        sql.push(" AND (")
            .push(DB::EVENT_FEED_ORDER)
            .push(") > (SELECT ")
            .push(DB::EVENT_FEED_ORDER)
            .push(" FROM outbox_events WHERE id = ")
            .value(cursor.as_uuid())
            .push(")");
    }
    sql.push(" ORDER BY ")
        .push(DB::EVENT_FEED_ORDER)
        .push(" LIMIT ")
        .value(i64::from(page.limit) + 1);
    sql
}

#[async_trait]
impl<S: SqlStore> EventRepository for S {
    async fn get_event(
        &self,
        tenant: &TenantId,
        id: EventId,
    ) -> Result<Option<StoredEvent>, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let row: Option<EventRow> = event::<S::Db>(tenant, id)
            .fetch_optional(&mut connection)
            .await?;
        row.map(EventRow::into_event).transpose()
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        page: ListEvents,
    ) -> Result<Option<EventPage>, StoreError> {
        if let Some(cursor) = page.starting_after
            && self.get_event(tenant, cursor).await?.is_none()
        {
            return Ok(None);
        }
        let mut connection = self.pool().acquire().await?;
        let rows = events_after::<S::Db>(tenant, page)
            .fetch_all(&mut connection)
            .await?;
        rows::event_page(rows, page.limit).map(Some)
    }
}
