//! `GET /idempotency-keys/{key}`: "did my request go through?" without retrying it.
//!
//! It shows the record's state and timing, never the stored response body: inspecting a key
//! must not become a second way to read a charge.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use chrono::SecondsFormat;
use payments_idempotency::engine::{Operation, RecordStore};
use payments_idempotency::{IdempotencyKey, IdempotencyRecord, RecordState};
use serde::{Deserialize, Serialize};

use crate::extract::{ApiQuery, Tenant};
use crate::operations::charge::CreateCharge;
use crate::operations::resolve::ResolveException;
use crate::{ApiError, AppState};

/// The query: which operation's key (a key is scoped to its operation's family, whatever its
/// schema version); a charge's by default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyParams {
    operation: Option<String>,
}

/// What a client may learn about one of its keys.
#[derive(Debug, Serialize)]
pub(super) struct KeyView {
    object: &'static str,
    key: String,
    operation: String,
    state: &'static str,
    recovery_point: &'static str,
    attempts: i32,
    /// The status of the stored response once completed (201, 402), else null.
    response_status: Option<u16>,
    /// The schema version of the operation that wrote the stored response, else null.
    response_schema_version: Option<u32>,
    /// SHA-256 of the request, so a client can check which payload the key belongs to.
    fingerprint: String,
    locked_until: Option<String>,
    created_at: String,
    /// When the key's retention ends, counted from the record's completion (the time the
    /// `Idempotency-Key-Expires` header carries). Null while pending: a pending key never
    /// expires.
    expires_at: Option<String>,
}

impl From<&IdempotencyRecord> for KeyView {
    fn from(record: &IdempotencyRecord) -> Self {
        let time =
            |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(SecondsFormat::Micros, true);
        Self {
            object: "idempotency_key",
            key: record.key.to_string(),
            operation: record.scope.operation.clone(),
            state: record.state.as_str(),
            recovery_point: record.recovery_point.as_str(),
            attempts: record.attempts.0,
            response_status: record.response.as_ref().map(|r| r.status),
            response_schema_version: record.response.as_ref().map(|r| r.schema_version.get()),
            fingerprint: record.fingerprint.to_hex(),
            locked_until: record.locked_until.map(time),
            created_at: time(record.created_at),
            expires_at: (record.state != RecordState::Pending).then(|| time(record.expires_at)),
        }
    }
}

pub(super) async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    raw: Result<Path<String>, PathRejection>,
    ApiQuery(params): ApiQuery<KeyParams>,
) -> Result<Json<KeyView>, ApiError> {
    let Path(raw) = raw.map_err(|_| {
        ApiError::IdempotencyKeyInvalid("the key in the path is not valid UTF-8".into())
    })?;
    let key =
        IdempotencyKey::parse(&raw).map_err(|e| ApiError::IdempotencyKeyInvalid(e.to_string()))?;
    let operation = params
        .operation
        .as_deref()
        .map_or(CreateCharge::FAMILY, family_of);
    // An operator's resolutions are keyed under the operator's name, never a tenant's: a tenant
    // whose id an operator's name happens to equal must not read them.
    let tenants_operations: Vec<&str> = state
        .engine
        .operation_names()
        .into_iter()
        .filter(|name| *name != ResolveException::FAMILY)
        .collect();
    let scope = tenants_operations
        .contains(&operation)
        .then(|| state.engine.scope_named(operation, tenant.as_str()))
        .flatten()
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "operation: must be one of {}, got {operation}",
                tenants_operations.join(", ")
            ))
        })?;
    let not_found = || ApiError::NotFound(format!("No such idempotency key: {key}"));
    let (record, now) = state
        .store
        .records()
        .find_record(&scope, &key)
        .await?
        .ok_or_else(not_found)?;
    // A record past its retention is gone as far as clients are concerned (the key is fresh
    // again), whether or not the reaper has deleted it yet.
    if record.is_expired(now) {
        return Err(not_found());
    }
    Ok(Json(KeyView::from(&record)))
}

/// The family an `operation` parameter names: `charges.create`, or the versioned name keys
/// were scoped by before (`charges.create.v1`), which is still accepted.
fn family_of(operation: &str) -> &str {
    match operation.rsplit_once(".v") {
        Some((family, version))
            if !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit()) =>
        {
            family
        }
        _ => operation,
    }
}

#[cfg(test)]
mod tests {
    use super::family_of;

    #[test]
    fn a_versioned_operation_name_names_its_family() {
        assert_eq!(family_of("charges.create"), "charges.create");
        assert_eq!(family_of("charges.create.v1"), "charges.create");
        assert_eq!(family_of("refunds.create.v12"), "refunds.create");
        assert_eq!(family_of("charges.create.v"), "charges.create.v");
        assert_eq!(family_of("charges.create.vx"), "charges.create.vx");
    }
}
