//! Liveness and readiness.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use crate::{ApiError, AppState};

/// The process is up. Touches nothing else, so a database outage does not get it restarted.
pub async fn live() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// The service can take traffic: the database answers.
pub async fn ready(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    state.store.ping().await?;
    Ok(Json(json!({ "status": "ready" })))
}
