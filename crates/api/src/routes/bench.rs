//! Bench-only endpoints (cargo feature `bench`): the floors the hot paths are measured
//! against. They skip authentication and idempotency on purpose and never exist in a
//! deployment build.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use payments_domain::{Charge, ChargeId, ChargeRequest, TenantId};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::extract::{ApiQuery, JsonBytes};
use crate::views::CreateChargeBody;
use crate::workers::reaper;
use crate::{ApiError, AppState};

/// One Redis GET: the floor of a cached replay.
pub async fn redis(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let cache = state
        .cache
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("Redis is disabled.".into()))?;
    cache
        .probe()
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    Ok(Json(json!({ "ok": true })))
}

/// The charge, ledger and outbox writes in one statement, without idempotency: the floor of
/// a first charge.
pub async fn charge(
    State(state): State<AppState>,
    JsonBytes(body): JsonBytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let body: CreateChargeBody =
        serde_json::from_slice(&body).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let request = ChargeRequest::try_from(body)?;
    let id = ChargeId::generate();
    let charge = Charge {
        id,
        tenant: TenantId::new("acme"),
        money: request.money,
        source: request.source,
        description: request.description,
        processor_charge_id: format!("bench_{}", id.as_uuid().simple()),
        created_at: Utc::now(),
    };
    state.store.write_charge_unguarded(&charge).await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id.to_string() }))))
}

#[derive(Debug, Deserialize)]
pub struct ReapParams {
    /// Rows per statement; the reaper's default (`workers.reaper_batch_size`) when absent.
    batch: Option<i64>,
}

/// Runs the reaper's batches (the worker's own loop, its pauses included) until nothing
/// expired is left, timing every statement.
pub async fn reap(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<ReapParams>,
) -> Result<Json<Value>, ApiError> {
    let batch = params.batch.unwrap_or(1000);
    if batch < 1 {
        return Err(ApiError::InvalidRequest("batch must be at least 1".into()));
    }
    // Never signalled: the reap runs to the end (the sender lives as long as the reap).
    let (_running, mut shutdown) = watch::channel(false);
    let started = std::time::Instant::now();
    let reaped = reaper::in_batches(batch, &mut shutdown, || state.store.reap_expired(batch)).await;
    if let Some(error) = reaped.error {
        return Err(error.into());
    }
    Ok(Json(json!({
        "deleted": reaped.deleted,
        "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
        "statements": reaped.statements,
        "batch": batch,
        "longest_statement_ms": reaped.longest.as_secs_f64() * 1e3,
    })))
}
