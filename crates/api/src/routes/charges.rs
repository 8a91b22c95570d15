//! `POST /charges`, `GET /charges/{id}`, `GET /charges`.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use payments_domain::ChargeId;
use payments_idempotency::canonical_json;
use payments_storage::ListCharges;
use serde::Deserialize;
use serde_json::Value;

use crate::extract::{ApiQuery, IdempotencyKeyHeader, JsonBytes, PreferWait, Tenant};
use crate::operations::charge::CreateCharge;
use crate::protocol::{self, Attempt};
use crate::replay::respond;
use crate::views::{ChargeList, ChargeView, CreateChargeBody};
use crate::{ApiError, AppState};

/// Everything is validated before the claim: a bad request stores nothing and leaves the key
/// free for a corrected request.
pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    PreferWait(wait): PreferWait,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let request = CreateChargeBody::parse(&body)?;
    let canonical: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::InvalidRequest(format!("Invalid JSON body: {e}")))?;
    let fingerprint = protocol::fingerprint_of::<CreateCharge>(&canonical);
    let canonical_body = canonical_json(&canonical).into_bytes();

    let attempt = Attempt {
        tenant,
        key,
        fingerprint,
        canonical_body,
        request,
        wait,
    };
    let answer = protocol::run(state.engine(), state.charges.as_ref(), attempt).await?;
    Ok(respond(answer.response, answer.replayed, answer.expires_at))
}

pub async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ChargeView>, ApiError> {
    // A segment that does not even decode (invalid UTF-8) names no charge either.
    let Path(id) = id.map_err(|_| ApiError::NotFound("No such charge.".into()))?;
    let not_found = || ApiError::NotFound(format!("No such charge: {id}"));
    let charge_id: ChargeId = id.parse().map_err(|_| not_found())?;
    let charge = state
        .store
        .get_charge(&tenant, charge_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(ChargeView::from(&charge)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    limit: Option<u32>,
    starting_after: Option<String>,
}

impl ListParams {
    const DEFAULT_LIMIT: u32 = 10;
    const MAX_LIMIT: u32 = 100;
}

pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<ChargeList>, ApiError> {
    let limit = params.limit.unwrap_or(ListParams::DEFAULT_LIMIT);
    if !(1..=ListParams::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "limit: must be between 1 and {}, got {limit}",
            ListParams::MAX_LIMIT
        )));
    }
    let unknown_cursor =
        |id: &str| ApiError::InvalidRequest(format!("starting_after: no such charge: {id}"));
    let starting_after = match params.starting_after.as_deref() {
        Some(id) => Some(id.parse::<ChargeId>().map_err(|_| unknown_cursor(id))?),
        None => None,
    };
    let page = state
        .store
        .list_charges(
            &tenant,
            ListCharges {
                limit,
                starting_after,
            },
        )
        .await?
        .ok_or_else(|| unknown_cursor(params.starting_after.as_deref().unwrap_or_default()))?;
    Ok(Json(ChargeList {
        object: "list",
        data: page.charges.iter().map(ChargeView::from).collect(),
        has_more: page.has_more,
    }))
}
