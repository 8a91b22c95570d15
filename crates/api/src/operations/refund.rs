//! `refunds.create`: refund part or all of a charge. The request is a [`RefundRequest`];
//! [`prepare`](Operation::prepare) reserves its amount on the charge, so refunds of one charge
//! under different keys never exceed it together; the effect is a [`ProcessorRefund`]; the
//! finish writes the succeeded refund, the charge's refunded amount, the reversing ledger
//! transaction and the `payment.refunded` event with the completed record. A refund that
//! definitively fails (declined, refused, or tombstoned by the completer) releases its
//! reservation in the transaction that ends its record.

use async_trait::async_trait;
use payments_domain::{
    ProcessorMetadata, ProcessorRefund, ProcessorRefundRequest, Refund, RefundRequest,
};
use payments_idempotency::engine::{
    Completion, EffectError, Ended, Operation, Owner, Prepared, ProtocolError, RecordStore,
    Settled, Unmade,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{RefundRefusal, Reservation};

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
        owner: Owner<'_>,
        request: &RefundRequest,
    ) -> Result<Prepared<ReservedRefund>, ProtocolError> {
        let reservation = self
            .0
            .store
            .reserve_refund(owner, request, now_to_the_microsecond())
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
            Reservation::Fenced => Ok(Prepared::Fenced),
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
        owner: Owner<'_>,
        reserved: &ReservedRefund,
        processor_refund_id: String,
    ) -> Result<(Completion, StoredResponse), ProtocolError> {
        let refund = reserved.refund.succeeded(processor_refund_id);
        let response = created(
            &RefundView::from(&refund),
            &format!("/refunds/{}", refund.id),
        )?;
        let completion = self
            .0
            .store
            .finish_refund(owner, &refund, &response)
            .await?;
        if completion != Completion::Fenced {
            tracing::info!(refund.id = %refund.id, charge.id = %refund.charge, "refund created");
        }
        Ok((completion, response))
    }

    /// The refund's own store ends the record, releasing the reservation with it.
    async fn end_unmade(&self, _: &dyn RecordStore, owner: Owner<'_>, end: Unmade<'_>) -> Ended {
        Ok(self.0.store.end_refund(owner, end).await?)
    }
}
