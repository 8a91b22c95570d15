//! Bench-only endpoints (cargo feature `bench`): the floors the hot paths are measured
//! against. They skip authentication and idempotency on purpose and never exist in a
//! deployment build.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use payments_domain::{Charge, ChargeId, ChargeRequest, TenantId};
use serde_json::{Value, json};

use crate::extract::JsonBytes;
use crate::views::CreateChargeBody;
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

/// Runs the reaper's batch delete until nothing expired is left, timing every statement.
pub async fn reap(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    const BATCH: i64 = 1000;
    let started = Instant::now();
    let (mut deleted, mut statements, mut longest_ms) = (0u64, 0u64, 0f64);
    loop {
        let statement = Instant::now();
        let n = state.store.reap_expired(BATCH).await?;
        longest_ms = longest_ms.max(statement.elapsed().as_secs_f64() * 1e3);
        statements += 1;
        deleted += n;
        if n < BATCH.unsigned_abs() {
            break;
        }
    }
    Ok(Json(json!({
        "deleted": deleted,
        "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
        "statements": statements,
        "longest_statement_ms": longest_ms,
    })))
}
