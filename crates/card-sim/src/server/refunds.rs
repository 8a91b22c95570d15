//! The refund handler and how a refund is shown: the same conventions and error shape as the
//! charge routes, over the simulator's refund book; its lookup and its cancel are the shared
//! handlers. A refund is keyed by its own `Idempotency-Key`, never by its charge's.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::HeaderMap;
use payments_domain::ProcessorRefund;

use super::error::SimError;
use super::routes::{Served, Sim, answered, idempotency_key, metadata, money};
use crate::simulator::{Made, RefundCall};
use crate::wire::{Metadata, REFUND_OBJECT, RefundBody, RefundView};

impl Served for ProcessorRefund {
    type View = RefundView;
    const MISSING: &'static str = "No refund was created under this idempotency key.";

    fn view(made: &Made<Self>) -> RefundView {
        let refund = &made.value;
        RefundView {
            object: REFUND_OBJECT.to_owned(),
            id: refund.id.clone(),
            charge: refund.processor_charge_id.clone(),
            amount: refund.money.amount.minor_units(),
            currency: refund.money.currency.code().to_owned(),
            status: refund.status.as_str().to_owned(),
            created: made.created_at.timestamp(),
            metadata: Metadata::of(made.metadata.as_ref()),
        }
    }
}

/// `POST /v1/refunds`: refunds part or all of a charge, or returns the refund already made
/// under the key. A refused refund is a 402 whose `decline_code` says why.
pub(crate) async fn create_refund(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: Result<Json<RefundBody>, JsonRejection>,
) -> Result<Json<RefundView>, SimError> {
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    let idempotency_key = idempotency_key(&headers)?;
    if body.charge.is_empty() {
        return Err(SimError::InvalidRequest(
            "charge must be the id of the charge to refund.".into(),
        ));
    }
    let call = RefundCall {
        money: money(body.amount, &body.currency)?,
        metadata: metadata(body.metadata)?,
        processor_charge_id: body.charge,
        idempotency_key,
    };
    let refund = answered(sim.submit_refund(call).await)?;
    tracing::info!(
        refund.id = %refund.value.id,
        refund.charge_id = %refund.value.processor_charge_id,
        refund.outcome = "succeeded",
        "refund"
    );
    Ok(Json(ProcessorRefund::view(&refund)))
}
