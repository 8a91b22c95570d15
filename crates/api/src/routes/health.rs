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

/// The service can take traffic: the database answers.
pub(super) async fn ready(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    state.store.ping().await?;
    Ok(Json(json!({ "status": "ready" })))
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
