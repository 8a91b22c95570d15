//! `charges.create.v1`: charge a card. The request is [`ChargeRequest`], the effect a
//! [`ProcessorCharge`], and the finish writes the charge, its balanced ledger transaction and
//! its `payment.completed` event with the completed record.

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use payments_domain::{
    CancelOutcome, CardProcessor, Charge, ChargeId, ChargeRequest, ProcessorCharge,
    ProcessorChargeRequest, ProcessorError,
};
use payments_idempotency::{CHARGES_CREATE_V1, StoredResponse};
use payments_storage::{Completion, Store, StoreError};

use super::created;
use crate::ApiError;
use crate::failpoint::{self, Failure};
use crate::metrics::ProcessorCall;
use crate::protocol::{Operation, Owner, Prepared, ProtocolError};
use crate::views::{ChargeView, CreateChargeBody};

/// Creating a charge.
#[derive(Debug, Default)]
pub struct CreateCharge;

#[async_trait]
impl Operation for CreateCharge {
    type Request = ChargeRequest;
    type Plan = ChargeRequest;
    type Effect = ProcessorCharge;

    const NAME: &'static str = CHARGES_CREATE_V1;
    const PROCESSOR_CALL: ProcessorCall = ProcessorCall::Charge;
    const ROUTE: (&'static str, &'static str) = ("POST", "/charges");

    fn stored_request(&self, body: &[u8]) -> Option<ChargeRequest> {
        CreateChargeBody::parse(body).ok()
    }

    /// A charge needs nothing but its request: no write, so a first charge stays at two
    /// commits (the claim and the finish).
    async fn prepare(
        &self,
        _store: &dyn Store,
        _owner: Owner<'_>,
        request: &ChargeRequest,
    ) -> Result<Prepared<ChargeRequest>, ProtocolError> {
        Ok(Prepared::Ready(request.clone()))
    }

    async fn effect(
        &self,
        processor: &dyn CardProcessor,
        request: &ChargeRequest,
        processor_key: &str,
    ) -> Result<ProcessorCharge, ProcessorError> {
        processor
            .charge(ProcessorChargeRequest {
                idempotency_key: processor_key.to_owned(),
                money: request.money,
                source: request.source.clone(),
            })
            .await
    }

    async fn settle(
        &self,
        processor: &dyn CardProcessor,
        processor_key: &str,
    ) -> Result<CancelOutcome<ProcessorCharge>, ProcessorError> {
        processor.cancel(processor_key).await
    }

    fn effect_id(charge: &ProcessorCharge) -> String {
        charge.id.clone()
    }

    fn confirms(charge: &ProcessorCharge, request: &ChargeRequest) -> Result<(), String> {
        charge.confirms(request.money).map_err(|e| e.to_string())
    }

    fn declined(&self, decline_code: String, message: String) -> StoredResponse {
        ApiError::CardDeclined {
            decline_code,
            message,
        }
        .to_stored_response()
    }

    /// The charge, its ledger transaction, its event and the completed record in one
    /// statement, fenced by the owner's generation and attempt.
    async fn finish(
        &self,
        store: &dyn Store,
        owner: Owner<'_>,
        request: &ChargeRequest,
        processor_charge_id: String,
    ) -> Result<(Completion, StoredResponse), ProtocolError> {
        let charge = Charge {
            id: ChargeId::from_uuid(owner.fence.resource_id),
            tenant: owner.tenant(),
            money: request.money,
            source: request.source.clone(),
            description: request.description.clone(),
            processor_charge_id,
            created_at: now_to_the_microsecond(),
            amount_refunded: 0,
        };
        let response = created_response(&charge)?;
        if failpoint::fails(Failure::Finish) {
            return Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut).into());
        }
        let completion = store
            .finish_charge(owner.scope, owner.key, owner.fence, &charge, &response)
            .await?;
        if completion != Completion::Fenced {
            tracing::info!(charge.id = %charge.id, "charge created");
        }
        Ok((completion, response))
    }
}

/// The 201 response of a charge. The bench floor `POST /bench/charge-2` stores the same.
pub(crate) fn created_response(charge: &Charge) -> Result<StoredResponse, ProtocolError> {
    created(
        &ChargeView::from(charge),
        &format!("/charges/{}", charge.id),
    )
}

/// PostgreSQL keeps microseconds: truncating first makes a charge (or a refund) read back
/// identical.
pub(crate) fn now_to_the_microsecond() -> DateTime<Utc> {
    let now = Utc::now();
    now.duration_trunc(TimeDelta::microseconds(1))
        .unwrap_or(now)
}
