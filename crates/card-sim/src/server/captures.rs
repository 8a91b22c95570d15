//! The capture and void handlers and how each is shown: the same conventions and error shape
//! as the refund routes, over the simulator's capture and void books; their lookups and their
//! cancels are the shared handlers. A capture or a void is keyed by its own `Idempotency-Key`,
//! never by its authorisation's.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::HeaderMap;
use payments_domain::{ProcessorCapture, ProcessorVoid};

use super::error::SimError;
use super::routes::{Served, Sim, answered, idempotency_key, metadata, money};
use crate::simulator::{CaptureCall, Made, VoidCall};
use crate::wire::{
    CAPTURE_OBJECT, CaptureBody, CaptureView, Metadata, VOID_OBJECT, VoidBody, VoidView,
};

impl Served for ProcessorCapture {
    type View = CaptureView;
    const MISSING: &'static str = "No capture was made under this idempotency key.";

    fn view(made: &Made<Self>) -> CaptureView {
        let capture = &made.value;
        CaptureView {
            object: CAPTURE_OBJECT.to_owned(),
            id: capture.id.clone(),
            charge: capture.processor_charge_id.clone(),
            amount: capture.money.amount.minor_units(),
            currency: capture.money.currency.code().to_owned(),
            created: made.created_at.timestamp(),
            metadata: Metadata::of(made.metadata.as_ref()),
        }
    }
}

impl Served for ProcessorVoid {
    type View = VoidView;
    const MISSING: &'static str = "No void was made under this idempotency key.";

    fn view(made: &Made<Self>) -> VoidView {
        let void = &made.value;
        VoidView {
            object: VOID_OBJECT.to_owned(),
            id: void.id.clone(),
            charge: void.processor_charge_id.clone(),
            amount: void.money.amount.minor_units(),
            currency: void.money.currency.code().to_owned(),
            created: made.created_at.timestamp(),
            metadata: Metadata::of(made.metadata.as_ref()),
        }
    }
}

/// `POST /v1/captures`: captures part or all of an authorisation, or returns the capture
/// already made under the key. A refused capture is a 402 whose `decline_code` says why.
pub(crate) async fn create_capture(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: Result<Json<CaptureBody>, JsonRejection>,
) -> Result<Json<CaptureView>, SimError> {
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    let idempotency_key = idempotency_key(&headers)?;
    let call = CaptureCall {
        money: money(body.amount, &body.currency)?,
        metadata: metadata(body.metadata)?,
        processor_charge_id: authorization(body.charge)?,
        idempotency_key,
    };
    let capture = answered(sim.submit_capture(call).await)?;
    tracing::info!(
        capture.id = %capture.value.id,
        capture.charge_id = %capture.value.processor_charge_id,
        capture.outcome = "succeeded",
        "capture"
    );
    Ok(Json(ProcessorCapture::view(&capture)))
}

/// `POST /v1/voids`: releases an authorisation, or returns the void already made under the
/// key. A refused void is a 402 whose `decline_code` says why.
pub(crate) async fn create_void(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: Result<Json<VoidBody>, JsonRejection>,
) -> Result<Json<VoidView>, SimError> {
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    let idempotency_key = idempotency_key(&headers)?;
    let call = VoidCall {
        metadata: metadata(body.metadata)?,
        processor_charge_id: authorization(body.charge)?,
        idempotency_key,
    };
    let void = answered(sim.submit_void(call).await)?;
    tracing::info!(
        void.id = %void.value.id,
        void.charge_id = %void.value.processor_charge_id,
        void.outcome = "succeeded",
        "void"
    );
    Ok(Json(ProcessorVoid::view(&void)))
}

/// A body's `charge`: it must name an authorisation.
fn authorization(charge: String) -> Result<String, SimError> {
    if charge.is_empty() {
        return Err(SimError::InvalidRequest(
            "charge must be the id of the authorisation to capture or void.".into(),
        ));
    }
    Ok(charge)
}
