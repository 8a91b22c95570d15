//! `POST /payouts`, `GET /payouts/{id}`, `GET /payouts`, `GET /balance`.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use payments_domain::PayoutId;
use payments_storage::ListPayouts;
use serde_json::Value;

use super::{ListParams, run_idempotent, tenants};
use crate::extract::{ApiQuery, IdempotentCall, JsonBytes, Tenant};
use crate::views::{CreatePayoutBody, FundsView, List, PayoutView, json_body};
use crate::{ApiError, AppState};

/// Everything is validated before the claim: a bad request stores nothing and leaves the key
/// free for a corrected request. The balance is judged after the claim, under its lock.
pub(super) async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let request = CreatePayoutBody::parse(&body)?;
    let canonical: Value = json_body(&body)?;
    run_idempotent(&state, state.payouts.as_ref(), call, &canonical, request).await
}

pub(super) async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<PayoutView>, ApiError> {
    let find = |id: PayoutId| state.store.get_payout(&tenant, id);
    let payout = tenants(id, "payout", find).await?;
    Ok(Json(PayoutView::from(&payout)))
}

pub(super) async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List<PayoutView>>, ApiError> {
    let read = |limit, starting_after| {
        let page = ListPayouts {
            limit,
            starting_after,
        };
        state.store.list_payouts(&tenant, page)
    };
    let page = params.page("payout", read).await?;
    Ok(Json(List::of(&page.payouts, page.has_more)))
}

/// What the tenant may pay out or refund now, and what its payouts in flight hold.
pub(super) async fn balance(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<Json<FundsView>, ApiError> {
    let funds = state.store.funds(&tenant).await?;
    Ok(Json(FundsView::of(&funds)))
}
