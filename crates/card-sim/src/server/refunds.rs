//! The refund handler and how a refund is shown: the same conventions and error shape as the
//! charge routes, over the simulator's refund book; its lookup and its cancel are the shared
//! handlers. A refund is keyed by its own `Idempotency-Key`, never by its charge's.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::HeaderMap;
use payments_domain::{ProcessorRefund, ProcessorRefundRequest};

use super::error::SimError;
use super::routes::{Served, Sim, answered, idempotency_key, money};
use crate::wire::{REFUND_OBJECT, RefundBody, RefundView};

impl Served for ProcessorRefund {
    type View = RefundView;
    const MISSING: &'static str = "No refund was created under this idempotency key.";

    fn view(&self) -> RefundView {
        RefundView {
            object: REFUND_OBJECT.to_owned(),
            id: self.id.clone(),
            charge: self.processor_charge_id.clone(),
            amount: self.money.amount.minor_units(),
            currency: self.money.currency.code().to_owned(),
            status: self.status.as_str().to_owned(),
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
    let request = ProcessorRefundRequest {
        money: money(body.amount, &body.currency)?,
        processor_charge_id: body.charge,
        idempotency_key,
    };
    let refund = answered(sim.submit_refund(request).await)?;
    tracing::info!(
        refund.id = %refund.id,
        refund.charge_id = %refund.processor_charge_id,
        refund.outcome = "succeeded",
        "refund"
    );
    Ok(Json(refund.view()))
}
