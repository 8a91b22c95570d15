//! The calls the simulator takes: what the ports' requests ask for, with the metadata
//! optional. The service always sends metadata, so the ports' requests require it; a caller
//! over HTTP may send none, as at any processor whose metadata is optional.

use payments_domain::{
    CaptureMethod, Destination, Money, PaymentSource, ProcessorCaptureRequest,
    ProcessorChargeRequest, ProcessorMetadata, ProcessorPayoutRequest, ProcessorRefundRequest,
    ProcessorVoidRequest,
};

/// A charge call: captured at once ([`CaptureMethod::Automatic`]), or an authorisation held
/// until a capture or a void ([`CaptureMethod::Manual`]). Both are keyed in the charges' book.
#[derive(Debug, Clone)]
pub(crate) struct ChargeCall {
    pub(crate) idempotency_key: String,
    pub(crate) money: Money,
    pub(crate) source: PaymentSource,
    pub(crate) metadata: Option<ProcessorMetadata>,
    pub(crate) capture: CaptureMethod,
}

/// A charge request is a charge captured at once; an authorisation sets `capture`.
impl From<ProcessorChargeRequest> for ChargeCall {
    fn from(request: ProcessorChargeRequest) -> Self {
        Self {
            idempotency_key: request.idempotency_key,
            money: request.money,
            source: request.source,
            metadata: Some(request.metadata),
            capture: CaptureMethod::Automatic,
        }
    }
}

/// A refund call: `processor_charge_id` is the simulator's id of the charge to refund.
#[derive(Debug, Clone)]
pub(crate) struct RefundCall {
    pub(crate) idempotency_key: String,
    pub(crate) processor_charge_id: String,
    pub(crate) money: Money,
    pub(crate) metadata: Option<ProcessorMetadata>,
}

impl From<ProcessorRefundRequest> for RefundCall {
    fn from(request: ProcessorRefundRequest) -> Self {
        Self {
            idempotency_key: request.idempotency_key,
            processor_charge_id: request.processor_charge_id,
            money: request.money,
            metadata: Some(request.metadata),
        }
    }
}

/// A capture call: `processor_charge_id` is the simulator's id of the authorisation to
/// capture, `money` what to take of it.
#[derive(Debug, Clone)]
pub(crate) struct CaptureCall {
    pub(crate) idempotency_key: String,
    pub(crate) processor_charge_id: String,
    pub(crate) money: Money,
    pub(crate) metadata: Option<ProcessorMetadata>,
}

impl From<ProcessorCaptureRequest> for CaptureCall {
    fn from(request: ProcessorCaptureRequest) -> Self {
        Self {
            idempotency_key: request.idempotency_key,
            processor_charge_id: request.processor_charge_id,
            money: request.money,
            metadata: Some(request.metadata),
        }
    }
}

/// A void call: `processor_charge_id` is the simulator's id of the authorisation to release.
#[derive(Debug, Clone)]
pub(crate) struct VoidCall {
    pub(crate) idempotency_key: String,
    pub(crate) processor_charge_id: String,
    pub(crate) metadata: Option<ProcessorMetadata>,
}

impl From<ProcessorVoidRequest> for VoidCall {
    fn from(request: ProcessorVoidRequest) -> Self {
        Self {
            idempotency_key: request.idempotency_key,
            processor_charge_id: request.processor_charge_id,
            metadata: Some(request.metadata),
        }
    }
}

/// A payout call.
#[derive(Debug, Clone)]
pub(crate) struct PayoutCall {
    pub(crate) idempotency_key: String,
    pub(crate) money: Money,
    pub(crate) destination: Destination,
    pub(crate) metadata: Option<ProcessorMetadata>,
}

impl From<ProcessorPayoutRequest> for PayoutCall {
    fn from(request: ProcessorPayoutRequest) -> Self {
        Self {
            idempotency_key: request.idempotency_key,
            money: request.money,
            destination: request.destination,
            metadata: Some(request.metadata),
        }
    }
}
