//! `payouts.create`: pay part of the tenant's balance out to one of its bank accounts. The
//! request is a [`PayoutRequest`]; [`prepare`](Operation::prepare) reserves its amount on the
//! tenant's balance, so payouts and refunds under different keys never take it below zero
//! together; the effect is a [`ProcessorPayout`]; the finish writes the paid payout, its ledger
//! transaction and the `payout.paid` event in the transaction the engine completes the record
//! in. A payout that definitively fails (declined, refused, or tombstoned by the completer)
//! releases its reservation in the transaction the engine ends its record in.

use async_trait::async_trait;
use payments_domain::{
    Payout, PayoutRequest, ProcessorMetadata, ProcessorPayout, ProcessorPayoutRequest,
};
use payments_idempotency::engine::{
    EffectError, Operation, Owner, Prepared, Preparing, ProtocolError, Settled, Unmade,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{PayoutReservation, Transaction};

use super::charge::now_to_the_microsecond;
use super::{Ports, SCHEMA_VERSION, created, effect_error, settled};
use crate::views::{CreatePayoutBody, PayoutView};
use crate::{ApiError, Decline};

/// Paying out: the processor's payouts are its effect port, and the store holds its
/// reservation, payout, ledger and outbox rows.
#[derive(Debug)]
pub struct CreatePayout(pub Ports);

#[async_trait]
impl Operation for CreatePayout {
    type Request = PayoutRequest;
    /// The pending payout: its id is the record's generation, its amount the one reserved.
    type Plan = Payout;
    type Effect = ProcessorPayout;
    type Transaction = Transaction;

    const FAMILY: &'static str = "payouts.create";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "payout";
    const ROUTE: (&'static str, &'static str) = ("POST", "/payouts");

    fn canonical_request(request: &PayoutRequest) -> serde_json::Value {
        CreatePayoutBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<PayoutRequest> {
        CreatePayoutBody::parse(body).ok()
    }

    /// Reserves the amount on the tenant's balance, or answers for good when the balance
    /// cannot give it.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &PayoutRequest,
    ) -> Result<Prepared<Payout>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let reservation = self
            .0
            .store
            .reserve_payout(transaction, owner, request, now_to_the_microsecond())
            .await?;
        Ok(match reservation {
            PayoutReservation::Reserved(payout) => Prepared::Ready(payout),
            PayoutReservation::InsufficientBalance { available } => {
                Prepared::Refused(ApiError::InsufficientBalance { available }.to_stored_response())
            }
        })
    }

    async fn effect(
        &self,
        payout: &Payout,
        effect_key: &str,
    ) -> Result<ProcessorPayout, EffectError> {
        self.0
            .processor
            .payout(ProcessorPayoutRequest {
                idempotency_key: effect_key.to_owned(),
                money: payout.money,
                destination: payout.destination.clone(),
                metadata: ProcessorMetadata::payout(payout.tenant.clone(), payout.id),
            })
            .await
            .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorPayout>, EffectError> {
        settled(self.0.processor.cancel_payout(effect_key).await)
    }

    fn effect_id(payout: &ProcessorPayout) -> String {
        payout.id.clone()
    }

    fn confirms(reported: &ProcessorPayout, payout: &Payout) -> Result<(), String> {
        reported
            .confirms(&payout.destination, payout.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        ApiError::PayoutDeclined(Decline::new(code, message)).to_stored_response()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        _: Owner<'_>,
        pending: &Payout,
        processor_payout_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let payout = pending.paid(processor_payout_id);
        let response = created(
            &PayoutView::from(&payout),
            &format!("/payouts/{}", payout.id),
        )?;
        self.0.store.finish_payout(transaction, &payout).await?;
        Ok(response)
    }

    /// The reservation goes with the record.
    async fn end_unmade(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        _: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        Ok(self.0.store.release_payout(transaction, owner).await?)
    }
}
