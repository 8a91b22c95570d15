//! `charges.cancel`: void a hold (a charge made with `"capture": false`) at the processor and
//! release it. The request is a [`CancelRequest`]; [`prepare`] claims the hold for the record's
//! generation, as a capture does, so that exactly one of a capture and a cancel ends it; the
//! effect is a [`ProcessorVoid`]; the finish ends the hold as canceled and writes
//! `payment.canceled`, in the transaction the engine completes the record in. Nothing is
//! posted: nothing was taken. A cancel that definitively fails releases its claim.
//!
//! Its route is `POST /charges/{id}/cancel`; it answers with the charge. The expiry of holds
//! past their `capture_before` runs this same operation, with the reason `expired`.
//!
//! [`prepare`]: Operation::prepare

use async_trait::async_trait;
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::post;
use payments_domain::{
    CancelRequest, CancellationReason, Charge, ChargeId, ProcessorMetadata, ProcessorVoid,
    ProcessorVoidRequest,
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
use super::hold::{CHARGE, HoldRefusal, claimed, end_hold};
use super::{Ports, SCHEMA_VERSION, effect_error, ok, settled};
use crate::extract::{IdempotentCall, JsonBytes};
use crate::views::{invalid_field, json_body, present, split_stored};
use crate::{ApiError, AppState};

/// Canceling a hold: the card processor is its effect port, and the store holds the hold's
/// claim, its end and its event.
#[derive(Debug)]
pub(crate) struct CancelCharge(pub Ports);

/// A hold claimed for a cancel.
#[derive(Debug)]
pub(crate) struct ClaimedCancel {
    charge: Charge,
    reason: Option<CancellationReason>,
}

#[async_trait]
impl Operation for CancelCharge {
    type Request = CancelRequest;
    type Plan = ClaimedCancel;
    type Effect = ProcessorVoid;
    type Transaction = Transaction;

    const FAMILY: &'static str = "charges.cancel";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "void";
    const ROUTE: (&'static str, &'static str) = ("POST", "/charges/{id}/cancel");

    fn canonical_request(request: &CancelRequest) -> Value {
        CancelChargeBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<CancelRequest> {
        CancelChargeBody::parse_stored(body).ok()
    }

    /// Claims the hold for this generation, unless it was captured or canceled already; every
    /// later attempt of the generation finds its claim.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &CancelRequest,
    ) -> Result<Prepared<ClaimedCancel>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let claim = captures::claim_hold(
            transaction,
            owner,
            request.charge,
            HoldEnd::Cancel,
            HoldRefusal::of_cancel,
        )
        .await?;
        let charge = match claimed(claim, request.charge) {
            Ok(charge) => charge,
            Err(refused) => return Ok(Prepared::Refused(refused)),
        };
        Ok(Prepared::Ready(ClaimedCancel {
            charge,
            reason: request.reason,
        }))
    }

    async fn effect(
        &self,
        claimed: &ClaimedCancel,
        effect_key: &str,
    ) -> Result<ProcessorVoid, EffectError> {
        let charge = &claimed.charge;
        self.0
            .processor
            .void(ProcessorVoidRequest {
                idempotency_key: effect_key.to_owned(),
                processor_charge_id: charge.processor_charge_id.clone(),
                metadata: ProcessorMetadata::charge(charge.tenant.clone(), charge.id),
            })
            .await
            .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorVoid>, EffectError> {
        settled(self.0.processor.cancel_void(effect_key).await)
    }

    fn effect_id(void: &ProcessorVoid) -> String {
        void.id.clone()
    }

    fn confirms(void: &ProcessorVoid, claimed: &ClaimedCancel) -> Result<(), String> {
        void.confirms(&claimed.charge.processor_charge_id, claimed.charge.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        HoldRefusal::declined(&code, message, "cancel_declined").stored()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        _: Owner<'_>,
        claimed: &ClaimedCancel,
        processor_void_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let at = now_to_the_microsecond();
        let (charge, reason) = (&claimed.charge, claimed.reason);
        captures::cancel_hold(transaction, charge, reason, &processor_void_id, at).await?;
        ok(&ChargeView::from(&claimed.charge.canceled(claimed.reason)))
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

/// The cancel's route.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/charges/{id}/cancel", post(create))
}

async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    id: Result<Path<String>, PathRejection>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let op = &state.operations.cancels;
    end_hold(&state, op, call, id, &body, CancelChargeBody::parse).await
}

/// The body of `POST /charges/{id}/cancel`: Stripe's optional `cancellation_reason`. Unknown
/// fields are rejected.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelChargeBody {
    #[serde(default, deserialize_with = "present")]
    pub cancellation_reason: Option<String>,
}

impl CancelChargeBody {
    /// A client's cancel: one of the reasons a client may give.
    fn parse(body: &[u8], charge: ChargeId) -> Result<CancelRequest, ApiError> {
        let typed: Self = json_body(body)?;
        typed.into_request(charge, &CancellationReason::GIVEN_BY_CLIENTS)
    }

    /// A stored cancel, the expiry's (`expired`) among them.
    fn parse_stored(body: &[u8]) -> Result<CancelRequest, ApiError> {
        let (charge, typed): (ChargeId, Self) = split_stored(body, CHARGE)?;
        typed.into_request(charge, &CancellationReason::ALL)
    }

    /// `request` as the body every version of `charges.cancel` shares, the charge of the path
    /// included.
    pub(crate) fn canonical(request: &CancelRequest) -> Value {
        let mut body = serde_json::Map::new();
        body.insert(CHARGE.into(), request.charge.to_string().into());
        if let Some(reason) = request.reason {
            body.insert("cancellation_reason".into(), reason.name().into());
        }
        Value::Object(body)
    }

    fn into_request(
        self,
        charge: ChargeId,
        allowed: &[CancellationReason],
    ) -> Result<CancelRequest, ApiError> {
        let reason = self
            .cancellation_reason
            .map(|name| {
                CancellationReason::from_name(&name)
                    .filter(|reason| allowed.contains(reason))
                    .ok_or_else(|| {
                        let names: Vec<_> = allowed.iter().map(|r| r.name()).collect();
                        let reason = format!("must be one of {}", names.join(", "));
                        invalid_field("cancellation_reason", &reason)
                    })
            })
            .transpose()?;
        Ok(CancelRequest { charge, reason })
    }
}
