//! Pure payment types and rules: money, currencies, tenants, charges, the double-entry ledger,
//! the outbox events, the [`CardProcessor`] port, with its refunds, payouts with the
//! [`PayoutProcessor`] port, and the processor's settlement report ([`SettlementReport`]).
//!
//! This crate owns the invariants that must hold whatever stores or serves them: an amount is
//! never zero or negative, a ledger transaction always balances. It performs no I/O and must not
//! import axum, sqlx, redis or any other crate of the workspace.

mod capture;
mod card_number;
mod charge;
mod event;
mod ids;
mod ledger;
mod money;
mod payout;
mod processor;
mod reconciliation;
mod refund;
mod resolution;
mod settlement;
mod webhook_url;

pub use capture::{
    CancelRequest, CancellationReason, Capture, CaptureMethod, CaptureRequest, ManualCapture,
    ProcessorCapture, ProcessorCaptureRequest, ProcessorVoid, ProcessorVoidRequest, decline,
};
pub use card_number::{contains_card_number, mask_card_numbers};
pub use charge::{
    Charge, ChargeRequest, Description, DescriptionError, PaymentSource, SourceError,
};
pub use event::{
    Canceled, Event, EventType, PAYMENT_AUTHORIZED, PAYMENT_CANCELED, PAYMENT_COMPLETED,
    PAYMENT_REFUNDED, PAYOUT_PAID, PaidOut, Payment, PaymentAuthorized, PaymentCanceled,
    PaymentCompleted, PaymentRefunded, PayoutPaid, Refunded,
};
pub use ids::{ChargeId, EventId, ExceptionId, IdError, PayoutId, RefundId, TenantId};
pub use ledger::{Account, LedgerEntry, LedgerError, LedgerTransaction};
pub use money::{Amount, AmountError, Currency, CurrencyError, Money};
pub use payout::{
    Destination, DestinationError, Payout, PayoutProcessor, PayoutRequest, PayoutStatus,
    ProcessorPayout, ProcessorPayoutRequest, ProcessorPayoutStatus,
};
pub use processor::{
    CancelOutcome, CardProcessor, ProcessorCharge, ProcessorChargeRequest, ProcessorChargeStatus,
    ProcessorError, ProcessorMismatch,
};
pub use reconciliation::{BooksEntry, HeldRecord, ItemResult, ReconciledItem, Sides, compare};
pub use refund::{
    ProcessorRefund, ProcessorRefundRequest, ProcessorRefundStatus, Refund, RefundReason,
    RefundRequest, RefundStatus,
};
pub use resolution::{NoteError, ResolutionAction, ResolutionNote, ResolutionRequest};
pub use settlement::{ProcessorMetadata, SettlementKind, SettlementLine, SettlementReport};
pub use webhook_url::{
    AddressPolicy, AddressRefusal, EndpointUrl, Forbidden, Host, MAX_URL_LEN, UrlError,
};
