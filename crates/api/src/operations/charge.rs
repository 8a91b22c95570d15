//! `charges.create`: charge a card. The request is [`ChargeRequest`], the effect a
//! [`ProcessorCharge`], and the finish writes the charge, its balanced ledger transaction and
//! its `payment.completed` event in the transaction the engine completes the record in.

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use payments_domain::{
    Charge, ChargeId, ChargeRequest, ProcessorCharge, ProcessorChargeRequest, ProcessorMetadata,
    TenantId,
};
use payments_idempotency::engine::{
    EffectError, Operation, Owner, Prepared, Preparing, ProtocolError, Settled,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{StoreError, Transaction};

use super::{Ports, SCHEMA_VERSION, created, effect_error, settled};
use crate::failpoint::{self, Failure};
use crate::views::{ChargeView, CreateChargeBody};
use crate::{ApiError, Decline};

/// Creating a charge: the card processor is its effect port, and the store holds its charge,
/// ledger and outbox rows.
#[derive(Debug)]
pub struct CreateCharge(pub Ports);

/// A charge ready for the processor: the request, and the ids the charge will have, fixed by
/// the record's generation before the processor is called, so that the processor keeps them
/// with the charge (its metadata) whether or not the service ever learns its answer.
#[derive(Debug)]
pub struct PlannedCharge {
    id: ChargeId,
    tenant: TenantId,
    request: ChargeRequest,
}

#[async_trait]
impl Operation for CreateCharge {
    type Request = ChargeRequest;
    type Plan = PlannedCharge;
    type Effect = ProcessorCharge;
    type Transaction = Transaction;

    const FAMILY: &'static str = "charges.create";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "charge";
    const ROUTE: (&'static str, &'static str) = ("POST", "/charges");

    fn canonical_request(request: &ChargeRequest) -> serde_json::Value {
        CreateChargeBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<ChargeRequest> {
        CreateChargeBody::parse(body).ok()
    }

    /// A charge needs nothing but its request and its record's generation: no transaction, so
    /// a first charge stays at two commits (the claim and the finish).
    async fn prepare(
        &self,
        _: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &ChargeRequest,
    ) -> Result<Prepared<PlannedCharge>, ProtocolError> {
        Ok(Prepared::Ready(PlannedCharge {
            id: ChargeId::from_uuid(owner.fence.generation),
            tenant: TenantId::new(owner.scope.tenant.clone()),
            request: request.clone(),
        }))
    }

    async fn effect(
        &self,
        planned: &PlannedCharge,
        effect_key: &str,
    ) -> Result<ProcessorCharge, EffectError> {
        let request = &planned.request;
        self.0
            .processor
            .charge(ProcessorChargeRequest {
                idempotency_key: effect_key.to_owned(),
                money: request.money,
                source: request.source.clone(),
                metadata: ProcessorMetadata::charge(planned.tenant.clone(), planned.id),
            })
            .await
            .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorCharge>, EffectError> {
        settled(self.0.processor.cancel(effect_key).await)
    }

    fn effect_id(charge: &ProcessorCharge) -> String {
        charge.id.clone()
    }

    fn confirms(charge: &ProcessorCharge, planned: &PlannedCharge) -> Result<(), String> {
        charge
            .confirms(planned.request.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        ApiError::CardDeclined(Decline::new(code, message)).to_stored_response()
    }

    /// The charge, its ledger transaction and its event, in one statement.
    async fn finish(
        &self,
        transaction: &mut Transaction,
        _: Owner<'_>,
        planned: &PlannedCharge,
        processor_charge_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let request = &planned.request;
        let charge = Charge {
            id: planned.id,
            tenant: planned.tenant.clone(),
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
        self.0.store.insert_charge(transaction, &charge).await?;
        Ok(response)
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
