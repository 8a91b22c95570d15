//! `POST /charges`, `GET /charges/{id}`, `GET /charges`.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use payments_domain::{Charge, ChargeId, TenantId};
use payments_storage::ListCharges;
use serde_json::Value;

use super::{ListParams, run_idempotent, tenants};
use crate::extract::{ApiQuery, IdempotentCall, JsonBytes, Tenant};
use crate::views::{ChargeView, CreateChargeBody, List, json_body};
use crate::{ApiError, AppState};

/// Everything is validated before the claim: a bad request stores nothing and leaves the key
/// free for a corrected request.
pub(super) async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let request = CreateChargeBody::parse(&body)?;
    let canonical: Value = json_body(&body)?;
    run_idempotent(&state, state.charges.as_ref(), call, &canonical, request).await
}

pub(super) async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ChargeView>, ApiError> {
    let charge = tenants_charge(&state, &tenant, id).await?;
    Ok(Json(ChargeView::from(&charge)))
}

/// The tenant's charge the path names, or 404.
pub(super) async fn tenants_charge(
    state: &AppState,
    tenant: &TenantId,
    id: Result<Path<String>, PathRejection>,
) -> Result<Charge, ApiError> {
    tenants(id, "charge", |id: ChargeId| {
        state.store.get_charge(tenant, id)
    })
    .await
}

pub(super) async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List<ChargeView>>, ApiError> {
    let read = |limit, starting_after| {
        let page = ListCharges {
            limit,
            starting_after,
        };
        state.store.list_charges(&tenant, page)
    };
    let page = params.page("charge", read).await?;
    Ok(Json(List::of(&page.charges, page.has_more)))
}
