//! Liveness, readiness and metrics.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::{ApiError, AppState};

/// The process is up. Touches nothing else, so a database outage does not get it restarted.
pub(super) async fn live() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// The service can take traffic: the database answers. The answer says how durable its
/// acknowledged commits are (`standby` or `local`), read from the database each time, since a
/// failover can change it.
pub(super) async fn ready(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let durability = state.store.durability().await?;
    crate::metrics::record_durability(durability);
    Ok(Json(
        json!({ "status": "ready", "durability": durability.name() }),
    ))
}

/// Prometheus text exposition of this instance's metrics.
pub(super) async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let handle = state
        .metrics
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("Metrics are not recorded by this process.".into()))?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    ))
}
