//! The payout handler and how a payout is shown: the same conventions and error shape as the
//! charge routes, over the simulator's payout book; its lookup and its cancel are the shared
//! handlers.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::HeaderMap;
use payments_domain::{Destination, ProcessorPayout};

use super::error::SimError;
use super::routes::{Served, Sim, answered, idempotency_key, metadata, money};
use crate::simulator::{Made, PayoutCall};
use crate::wire::{Metadata, PAYOUT_OBJECT, PayoutBody, PayoutView};

impl Served for ProcessorPayout {
    type View = PayoutView;
    const MISSING: &'static str = "No payout was made under this idempotency key.";

    fn view(made: &Made<Self>) -> PayoutView {
        let payout = &made.value;
        PayoutView {
            object: PAYOUT_OBJECT.to_owned(),
            id: payout.id.clone(),
            destination: payout.destination.clone(),
            amount: payout.money.amount.minor_units(),
            currency: payout.money.currency.code().to_owned(),
            status: payout.status.as_str().to_owned(),
            created: made.created_at.timestamp(),
            metadata: Metadata::of(made.metadata.as_ref()),
        }
    }
}

/// `POST /v1/payouts`: pays `amount` to the bank account `destination`, or returns the payout
/// already made under the key. A refused payout is a 402 whose `decline_code` says why.
pub(crate) async fn create_payout(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: Result<Json<PayoutBody>, JsonRejection>,
) -> Result<Json<PayoutView>, SimError> {
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    let idempotency_key = idempotency_key(&headers)?;
    let call = PayoutCall {
        money: money(body.amount, &body.currency)?,
        destination: Destination::new(body.destination)
            .map_err(|e| SimError::InvalidRequest(e.to_string()))?,
        metadata: metadata(body.metadata)?,
        idempotency_key,
    };
    let payout = answered(sim.submit_payout(call).await)?;
    tracing::info!(payout.id = %payout.value.id, payout.outcome = "paid", "payout");
    Ok(Json(ProcessorPayout::view(&payout)))
}
