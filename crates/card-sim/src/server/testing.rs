//! `/v1/testing/...`: differences a test makes between the simulator and its report, so that
//! reconciliation has something to find. Never part of a real processor's API.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use payments_domain::{Amount, ProcessorCharge};
use serde::Deserialize;

use super::error::SimError;
use super::routes::{MAX_KEY_LEN, Served, Sim, answered, metadata, money};
use crate::UnknownProcessorId;
use crate::wire::{ChargeView, Metadata};

/// The body of `POST /v1/testing/report/drop`.
#[derive(Debug, Deserialize)]
pub(crate) struct DropBody {
    processor_id: String,
}

/// The body of `POST /v1/testing/report/alter`: the amount the line is to show.
#[derive(Debug, Deserialize)]
pub(crate) struct AlterBody {
    processor_id: String,
    amount: i64,
}

/// The body of `POST /v1/testing/charges/unsolicited`: `tenant` and `resource_id` are its
/// metadata, both or neither.
#[derive(Debug, Deserialize)]
pub(crate) struct UnsolicitedBody {
    processor_key: String,
    amount: i64,
    currency: String,
    tenant: Option<String>,
    resource_id: Option<String>,
}

/// `POST /v1/testing/report/drop`: the line of `processor_id` leaves every report; what it
/// made stays. 204, or 404 for an id the simulator does not remember.
pub(crate) async fn drop_line(
    State(sim): State<Sim>,
    body: Result<Json<DropBody>, JsonRejection>,
) -> Result<StatusCode, SimError> {
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    sim.drop_from_report(&body.processor_id)
        .map_err(not_found)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/testing/report/alter`: the line of `processor_id` shows `amount`. 204, or 404.
pub(crate) async fn alter_line(
    State(sim): State<Sim>,
    body: Result<Json<AlterBody>, JsonRejection>,
) -> Result<StatusCode, SimError> {
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    let amount = Amount::new(body.amount).map_err(|e| SimError::InvalidRequest(e.to_string()))?;
    sim.alter_in_report(&body.processor_id, amount)
        .map_err(not_found)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/testing/charges/unsolicited`: a charge under `processor_key` at once, as if
/// another caller had made it; the charge, or what the key already answers.
pub(crate) async fn unsolicited_charge(
    State(sim): State<Sim>,
    body: Result<Json<UnsolicitedBody>, JsonRejection>,
) -> Result<Json<ChargeView>, SimError> {
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    if body.processor_key.is_empty() || body.processor_key.len() > MAX_KEY_LEN {
        return Err(SimError::InvalidRequest(format!(
            "processor_key must be 1 to {MAX_KEY_LEN} bytes."
        )));
    }
    let metadata = metadata(Metadata {
        tenant: body.tenant,
        resource_id: body.resource_id,
    })?;
    let money = money(body.amount, &body.currency)?;
    let charge = answered(sim.unsolicited(body.processor_key, money, metadata))?;
    tracing::info!(charge.id = %charge.value.id, "unsolicited charge");
    Ok(Json(ProcessorCharge::view(&charge)))
}

fn not_found(error: UnknownProcessorId) -> SimError {
    SimError::NotFound(format!("{error}."))
}
