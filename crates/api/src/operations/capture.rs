//! `charges.capture`: take the money a hold (a charge made with `"capture": false`) has on the
//! card, all of it or less, once. The request is a [`CaptureRequest`]; [`prepare`] claims the
//! hold for the record's generation, so that one capture or one cancel is at work on it at a
//! time, and refuses what the hold has become (captured, canceled, past its `capture_before`,
//! less than asked); the effect is a [`ProcessorCapture`]; the finish ends the hold as captured,
//! posts what it took and writes `payment.completed`, in the transaction the engine completes
//! the record in. A capture that definitively fails releases its claim.
//!
//! Its route is `POST /charges/{id}/capture`; it answers with the charge.
//!
//! [`prepare`]: Operation::prepare

use async_trait::async_trait;
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::post;
use payments_domain::{
    Amount, CaptureRequest, Charge, ChargeId, Money, ProcessorCapture, ProcessorCaptureRequest,
    ProcessorMetadata,
};
use payments_idempotency::engine::{
    EffectError, Operation, Owner, Prepared, Preparing, ProtocolError, Settled, Unmade,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::Transaction;
use payments_storage::captures::{self, HoldEnd};
use serde::Deserialize;
use serde_json::Value;

use super::charge::{ChargeView, now_to_the_microsecond};
use super::hold::{HoldRefusal, claimed, end_hold};
use super::{Ports, SCHEMA_VERSION, effect_error, ok, settled};
use crate::extract::{IdempotentCall, JsonBytes};
use crate::views::{invalid_field, json_body, split_stored};
use crate::{ApiError, AppState};

/// Capturing a hold: the card processor is its effect port, and the store holds the hold's
/// claim, its end, its ledger transaction and its event.
#[derive(Debug)]
pub(crate) struct CaptureCharge(pub Ports);

/// A hold claimed for a capture of `money`.
#[derive(Debug)]
pub(crate) struct ClaimedCapture {
    charge: Charge,
    money: Money,
}

#[async_trait]
impl Operation for CaptureCharge {
    type Request = CaptureRequest;
    type Plan = ClaimedCapture;
    type Effect = ProcessorCapture;
    type Transaction = Transaction;

    const FAMILY: &'static str = "charges.capture";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "capture";
    const ROUTE: (&'static str, &'static str) = ("POST", "/charges/{id}/capture");

    fn canonical_request(request: &CaptureRequest) -> Value {
        CaptureChargeBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<CaptureRequest> {
        CaptureChargeBody::parse_stored(body).ok()
    }

    /// Claims the hold for this generation, unless what it has become refuses the capture.
    /// Every later attempt of the generation finds its claim and prepares the same capture,
    /// whatever the time: its effect may exist.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &CaptureRequest,
    ) -> Result<Prepared<ClaimedCapture>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let now = now_to_the_microsecond();
        let judge = |charge: &Charge| HoldRefusal::of_capture(charge, request.amount, now);
        let claim =
            captures::claim_hold(transaction, owner, request.charge, HoldEnd::Capture, judge)
                .await?;
        let charge = match claimed(claim, request.charge) {
            Ok(charge) => charge,
            Err(refused) => return Ok(Prepared::Refused(refused)),
        };
        let amount = request.amount.unwrap_or(charge.money.amount);
        let money = Money::new(amount, charge.money.currency);
        Ok(Prepared::Ready(ClaimedCapture { charge, money }))
    }

    async fn effect(
        &self,
        claimed: &ClaimedCapture,
        effect_key: &str,
    ) -> Result<ProcessorCapture, EffectError> {
        let charge = &claimed.charge;
        self.0
            .processor
            .capture(ProcessorCaptureRequest {
                idempotency_key: effect_key.to_owned(),
                processor_charge_id: charge.processor_charge_id.clone(),
                money: claimed.money,
                metadata: ProcessorMetadata::charge(charge.tenant.clone(), charge.id),
            })
            .await
            .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorCapture>, EffectError> {
        settled(self.0.processor.cancel_capture(effect_key).await)
    }

    fn effect_id(capture: &ProcessorCapture) -> String {
        capture.id.clone()
    }

    fn confirms(capture: &ProcessorCapture, claimed: &ClaimedCapture) -> Result<(), String> {
        capture
            .confirms(&claimed.charge.processor_charge_id, claimed.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        HoldRefusal::declined(&code, message, "capture_declined").stored()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        _: Owner<'_>,
        claimed: &ClaimedCapture,
        processor_capture_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let at = now_to_the_microsecond();
        let (charge, money) = (&claimed.charge, claimed.money);
        captures::capture_hold(transaction, charge, money, &processor_capture_id, at).await?;
        let captured = claimed.charge.captured(claimed.money.amount);
        ok(&ChargeView::from(&captured))
    }

    /// The claim goes with the record.
    async fn end_unmade(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        _: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        Ok(captures::release_hold(transaction, owner).await?)
    }
}

/// The capture's route.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/charges/{id}/capture", post(create))
}

async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    id: Result<Path<String>, PathRejection>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let op = &state.operations.captures;
    end_hold(&state, op, call, id, &body, CaptureChargeBody::parse).await
}

/// The body of `POST /charges/{id}/capture`: Stripe's `amount_to_capture`, all of the hold when
/// absent. Unknown fields are rejected.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CaptureChargeBody {
    #[serde(default, deserialize_with = "crate::views::present")]
    pub amount_to_capture: Option<i64>,
}

impl CaptureChargeBody {
    fn parse(body: &[u8], charge: ChargeId) -> Result<CaptureRequest, ApiError> {
        let typed: Self = json_body(body)?;
        typed.into_request(charge)
    }

    fn parse_stored(body: &[u8]) -> Result<CaptureRequest, ApiError> {
        let (charge, typed): (ChargeId, Self) = split_stored(body, super::hold::CHARGE)?;
        typed.into_request(charge)
    }

    fn canonical(request: &CaptureRequest) -> Value {
        let mut body = serde_json::Map::new();
        body.insert(
            super::hold::CHARGE.into(),
            request.charge.to_string().into(),
        );
        if let Some(amount) = request.amount {
            body.insert("amount_to_capture".into(), amount.minor_units().into());
        }
        Value::Object(body)
    }

    fn into_request(self, charge: ChargeId) -> Result<CaptureRequest, ApiError> {
        let amount = self
            .amount_to_capture
            .map(Amount::new)
            .transpose()
            .map_err(|e| invalid_field("amount_to_capture", &e))?;
        Ok(CaptureRequest { charge, amount })
    }
}
