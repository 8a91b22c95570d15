//! The payout handler and how a payout is shown: the same conventions and error shape as the
//! charge routes, over the simulator's payout book; its lookup and its cancel are the shared
//! handlers.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::HeaderMap;
use payments_domain::{Destination, ProcessorPayout, ProcessorPayoutRequest};

use super::error::SimError;
use super::routes::{Served, Sim, answered, idempotency_key, money};
use crate::wire::{PAYOUT_OBJECT, PayoutBody, PayoutView};

impl Served for ProcessorPayout {
    type View = PayoutView;
    const MISSING: &'static str = "No payout was made under this idempotency key.";

    fn view(&self) -> PayoutView {
        PayoutView {
            object: PAYOUT_OBJECT.to_owned(),
            id: self.id.clone(),
            destination: self.destination.clone(),
            amount: self.money.amount.minor_units(),
            currency: self.money.currency.code().to_owned(),
            status: self.status.as_str().to_owned(),
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
    let request = ProcessorPayoutRequest {
        money: money(body.amount, &body.currency)?,
        destination: Destination::new(body.destination)
            .map_err(|e| SimError::InvalidRequest(e.to_string()))?,
        idempotency_key,
    };
    let payout = answered(sim.submit_payout(request).await)?;
    tracing::info!(payout.id = %payout.id, payout.outcome = "paid", "payout");
    Ok(Json(payout.view()))
}
