//! `refunds.create`: refund part or all of a charge. The request is a [`RefundRequest`];
//! [`prepare`](Operation::prepare) reserves its amount on the charge, so refunds of one charge
//! under different keys never exceed it together; the effect is a [`ProcessorRefund`]; the
//! finish writes the succeeded refund, the charge's refunded amount, the reversing ledger
//! transaction and the `payment.refunded` event in the transaction the engine completes the
//! record in. A refund that definitively fails (declined, refused, or tombstoned by the
//! completer) releases its reservation in the transaction the engine ends its record in.

use async_trait::async_trait;
use payments_domain::{
    ProcessorMetadata, ProcessorRefund, ProcessorRefundRequest, Refund, RefundRequest,
};
use payments_idempotency::engine::{
    EffectError, Operation, Owner, Prepared, Preparing, ProtocolError, Settled, Unmade,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{RefundRefusal, Reservation, Transaction};

use super::charge::now_to_the_microsecond;
use super::{Ports, SCHEMA_VERSION, created, effect_error, settled};
use crate::views::{CreateRefundBody, RefundView};
use crate::{ApiError, Decline};

/// Refunding a charge: the card processor is its effect port, and the store holds its
/// reservation, refund, ledger and outbox rows.
#[derive(Debug)]
pub struct CreateRefund(pub Ports);

/// A refund reserved on its charge, ready for the processor.
#[derive(Debug)]
pub struct ReservedRefund {
    /// The pending refund: its id is the record's generation, its amount the one reserved.
    refund: Refund,
    /// The processor's id of the charge to refund.
    processor_charge_id: String,
}

#[async_trait]
impl Operation for CreateRefund {
    type Request = RefundRequest;
    type Plan = ReservedRefund;
    type Effect = ProcessorRefund;
    type Transaction = Transaction;

    const FAMILY: &'static str = "refunds.create";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "refund";
    const ROUTE: (&'static str, &'static str) = ("POST", "/charges/{id}/refunds");

    fn canonical_request(request: &RefundRequest) -> serde_json::Value {
        CreateRefundBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<RefundRequest> {
        CreateRefundBody::parse_stored(body).ok()
    }

    /// Reserves the amount (all that is left when none was asked for) on the charge, or
    /// answers for good when the charge cannot give it.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &RefundRequest,
    ) -> Result<Prepared<ReservedRefund>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let reservation = self
            .0
            .store
            .reserve_refund(transaction, owner, request, now_to_the_microsecond())
            .await?;
        let refused = |error: ApiError| Ok(Prepared::Refused(error.to_stored_response()));
        match reservation {
            Reservation::Reserved {
                refund,
                processor_charge_id,
            } => Ok(Prepared::Ready(ReservedRefund {
                refund,
                processor_charge_id,
            })),
            Reservation::Refused(RefundRefusal::TooLarge { refundable }) => {
                refused(ApiError::RefundAmountTooLarge { refundable })
            }
            Reservation::Refused(RefundRefusal::NothingLeft) => {
                refused(ApiError::ChargeAlreadyRefunded)
            }
            Reservation::Refused(RefundRefusal::InsufficientBalance { available }) => {
                refused(ApiError::InsufficientBalance { available })
            }
            Reservation::Refused(RefundRefusal::NoSuchCharge) => refused(ApiError::NotFound(
                format!("No such charge: {}", request.charge),
            )),
        }
    }

    async fn effect(
        &self,
        reserved: &ReservedRefund,
        effect_key: &str,
    ) -> Result<ProcessorRefund, EffectError> {
        self.0
            .processor
            .refund(ProcessorRefundRequest {
                idempotency_key: effect_key.to_owned(),
                processor_charge_id: reserved.processor_charge_id.clone(),
                money: reserved.refund.money,
                metadata: ProcessorMetadata::refund(
                    reserved.refund.tenant.clone(),
                    reserved.refund.id,
                ),
            })
            .await
            .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorRefund>, EffectError> {
        settled(self.0.processor.cancel_refund(effect_key).await)
    }

    fn effect_id(refund: &ProcessorRefund) -> String {
        refund.id.clone()
    }

    fn confirms(refund: &ProcessorRefund, reserved: &ReservedRefund) -> Result<(), String> {
        refund
            .confirms(&reserved.processor_charge_id, reserved.refund.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        ApiError::RefundDeclined(Decline::new(code, message)).to_stored_response()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        _: Owner<'_>,
        reserved: &ReservedRefund,
        processor_refund_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let refund = reserved.refund.succeeded(processor_refund_id);
        let response = created(
            &RefundView::from(&refund),
            &format!("/refunds/{}", refund.id),
        )?;
        self.0.store.finish_refund(transaction, &refund).await?;
        Ok(response)
    }

    /// The reservation goes with the record.
    async fn end_unmade(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        _: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        Ok(self.0.store.release_refund(transaction, owner).await?)
    }
}
