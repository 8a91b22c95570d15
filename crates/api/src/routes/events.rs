//! `GET /events`, `GET /events/{id}`: the tenant's events from the outbox, for a consumer that
//! missed the stream, oldest first, in pages that never skip or repeat an event however many
//! are being written meanwhile.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use payments_domain::{EventId, EventType};
use payments_storage::ListEvents;

use crate::extract::{ApiQuery, Tenant};
use crate::handling::{ListParams, tenants};
use crate::views::{EventView, List};
use crate::{ApiError, AppState};

/// The query of `GET /events`: a list's page size and cursor, and one type to keep.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventParams {
    limit: Option<u32>,
    starting_after: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
}

impl EventParams {
    /// The type to keep, if one is named: only a type this service writes.
    fn event_type(&self) -> Result<Option<EventType>, ApiError> {
        self.event_type
            .as_deref()
            .map(|name| {
                EventType::from_name(name).ok_or_else(|| {
                    let names: Vec<_> = EventType::ALL.iter().map(|t| t.name()).collect();
                    ApiError::InvalidRequest(format!("type: must be one of {}", names.join(", ")))
                })
            })
            .transpose()
    }
}

pub(super) async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<EventView>, ApiError> {
    let find = |id: EventId| state.store.get_event(&tenant, id);
    let event = tenants(id, "event", find).await?;
    Ok(Json(EventView::from(&event)))
}

pub(super) async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(params): ApiQuery<EventParams>,
) -> Result<Json<List<EventView>>, ApiError> {
    let event_type = params.event_type()?;
    let list = ListParams {
        limit: params.limit,
        starting_after: params.starting_after,
    };
    let read = |limit, starting_after| {
        let page = ListEvents {
            limit,
            starting_after,
            event_type,
        };
        state.store.list_events(&tenant, page)
    };
    let page = list.page("event", read).await?;
    Ok(Json(List::of(&page.events, page.has_more)))
}
