//! The card processor port: how the service asks a processor to move money.
//!
//! Implementations live outside the domain (an in-process simulator, an HTTP client). The
//! contract every implementation keeps: the same `idempotency_key` never creates a second
//! charge, and a timeout is [`ProcessorError::Unavailable`], never a success or a decline.

use async_trait::async_trait;

use crate::{Money, PaymentSource};

/// A charge to create at the processor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorChargeRequest {
    /// Deterministic per idempotency record: every attempt of one request sends the same key.
    pub idempotency_key: String,
    pub money: Money,
    pub source: PaymentSource,
}

/// A charge the processor created (or had already created under the same key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorCharge {
    pub id: String,
    pub money: Money,
}

/// The two ways a charge does not succeed, which the service treats very differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessorError {
    /// A definitive business outcome: stored and replayed like a success.
    #[error("card declined ({decline_code}): {message}")]
    Declined {
        decline_code: String,
        message: String,
    },
    /// Nothing is known to have happened: the caller may retry with the same key.
    #[error("processor unavailable: {reason}")]
    Unavailable { reason: String },
}

/// The port the charge flow calls. Object-safe so the service can pick an implementation at
/// start-up.
#[async_trait]
pub trait CardProcessor: Send + Sync + std::fmt::Debug + 'static {
    /// Creates the charge, or returns the one already created under the same idempotency key.
    async fn charge(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError>;

    /// Looks up the charge created under `idempotency_key` without ever creating one.
    async fn find_charge(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorCharge>, ProcessorError>;
}
