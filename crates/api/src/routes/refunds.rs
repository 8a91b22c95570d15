//! `POST /charges/{id}/refunds`, `GET /charges/{id}/refunds`, `GET /refunds/{id}`.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use payments_domain::RefundId;
use payments_storage::ListRefunds;
use serde_json::Value;

use super::charges::tenants_charge;
use super::{ListParams, run_idempotent, tenants};
use crate::extract::{ApiQuery, IdempotentCall, JsonBytes, Tenant};
use crate::views::{CreateRefundBody, List, RefundView, json_body};
use crate::{ApiError, AppState};

/// Everything is validated before the claim, the charge too: a bad request or a charge that is
/// not the tenant's stores nothing and leaves the key free.
pub(super) async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    id: Result<Path<String>, PathRejection>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let charge = tenants_charge(&state, &call.tenant, id).await?;
    let request = CreateRefundBody::parse(&body, charge.id)?;
    // The stored request names the charge, so that the fingerprint covers it and the completer
    // can finish the refund from the record alone.
    let mut canonical: Value = json_body(&body)?;
    let Value::Object(fields) = &mut canonical else {
        return Err(ApiError::InvalidRequest(
            "The body must be a JSON object.".into(),
        ));
    };
    fields.insert(
        CreateRefundBody::CHARGE.to_owned(),
        Value::String(charge.id.to_string()),
    );
    run_idempotent(&state, state.refunds.as_ref(), call, &canonical, request).await
}

pub(super) async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<RefundView>, ApiError> {
    let find = |id: RefundId| state.store.get_refund(&tenant, id);
    let refund = tenants(id, "refund", find).await?;
    Ok(Json(RefundView::from(&refund)))
}

pub(super) async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List<RefundView>>, ApiError> {
    let charge = tenants_charge(&state, &tenant, id).await?;
    let read = |limit, starting_after| {
        let page = ListRefunds {
            charge: charge.id,
            limit,
            starting_after,
        };
        state.store.list_refunds(&tenant, page)
    };
    let page = params.page("refund", read).await?;
    Ok(Json(List::of(&page.refunds, page.has_more)))
}
