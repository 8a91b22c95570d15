//! The card processor port: how the service asks a processor to move money, and how it learns
//! what happened to a call whose answer it never received.
//!
//! Implementations live outside the domain (an in-process simulator, an HTTP client). The
//! contract every implementation keeps, for charges and refunds alike: the same
//! `idempotency_key` never creates a second charge or refund; a timeout is
//! [`ProcessorError::Unavailable`], never a success or a decline; and only a cancel
//! ([`CardProcessor::cancel`], [`CardProcessor::cancel_refund`]) can say "there is nothing
//! under this key, and there never will be". A lookup that finds nothing is not that answer: a
//! call may still be in flight.

use async_trait::async_trait;

use crate::{
    CaptureMethod, Money, PaymentSource, ProcessorCapture, ProcessorCaptureRequest,
    ProcessorMetadata, ProcessorRefund, ProcessorRefundRequest, ProcessorVoid,
    ProcessorVoidRequest,
};

/// A charge to create at the processor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorChargeRequest {
    /// Deterministic per idempotency record: every attempt of one request sends the same key.
    pub idempotency_key: String,
    pub money: Money,
    pub source: PaymentSource,
    /// The tenant and the charge's id in the service, kept by the processor with the charge.
    pub metadata: ProcessorMetadata,
}

/// The status a processor reports for a charge. Only `Succeeded` is ever recorded, and
/// `RequiresCapture` for an authorisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessorChargeStatus {
    Succeeded,
    Pending,
    Failed,
    /// Authorised, and held until it is captured or voided.
    RequiresCapture,
}

impl ProcessorChargeStatus {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Pending => "pending",
            Self::Failed => "failed",
            Self::RequiresCapture => "requires_capture",
        }
    }

    /// Parses a wire name; `None` for a status this service does not know.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "succeeded" => Some(Self::Succeeded),
            "pending" => Some(Self::Pending),
            "failed" => Some(Self::Failed),
            "requires_capture" => Some(Self::RequiresCapture),
            _ => None,
        }
    }
}

/// A charge the processor created (or had already created under the same key), as the
/// processor reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorCharge {
    pub id: String,
    pub money: Money,
    pub status: ProcessorChargeStatus,
}

/// Why a charge or a refund the processor reported is not the one the request asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessorMismatch {
    #[error("the processor reported {id} as {status}, not as the call asked")]
    NotSucceeded { id: String, status: &'static str },
    #[error("the processor reported {id} for {reported}, the request was for {requested}")]
    Money {
        id: String,
        reported: Money,
        requested: Money,
    },
    /// A payout to another bank account than the one the request named.
    #[error("the processor reported payout {id} to {reported}, the request was for {requested}")]
    Destination {
        id: String,
        reported: String,
        requested: String,
    },
    /// A refund of another charge than the one the request named.
    #[error(
        "the processor reported refund {id} of charge {reported}, the request was for {requested}"
    )]
    Charge {
        id: String,
        reported: String,
        requested: String,
    },
}

impl ProcessorMismatch {
    /// The check charges and refunds share: `id` succeeded for exactly the `requested` money.
    /// The status comes first: the money of a charge or refund that did not succeed means
    /// nothing.
    pub(crate) fn check(
        id: &str,
        status: ProcessorChargeStatus,
        reported: Money,
        requested: Money,
    ) -> Result<(), Self> {
        Self::check_as(
            ProcessorChargeStatus::Succeeded,
            id,
            status,
            reported,
            requested,
        )
    }

    /// [`ProcessorMismatch::check`], for a call that ends in the status `expected`.
    fn check_as(
        expected: ProcessorChargeStatus,
        id: &str,
        status: ProcessorChargeStatus,
        reported: Money,
        requested: Money,
    ) -> Result<(), Self> {
        if status != expected {
            return Err(Self::NotSucceeded {
                id: id.to_owned(),
                status: status.as_str(),
            });
        }
        if reported != requested {
            return Err(Self::Money {
                id: id.to_owned(),
                reported,
                requested,
            });
        }
        Ok(())
    }
}

impl ProcessorCharge {
    /// Accepts the charge as the one `requested` made only if it succeeded for exactly that
    /// amount and currency. Anything else must never reach the ledger.
    pub fn confirms(&self, requested: Money) -> Result<(), ProcessorMismatch> {
        ProcessorMismatch::check(&self.id, self.status, self.money, requested)
    }

    /// [`ProcessorCharge::confirms`] for a charge made with `method`: an authorisation is
    /// accepted only as `requires_capture`, for exactly the money asked to be held.
    pub fn confirms_as(
        &self,
        method: CaptureMethod,
        requested: Money,
    ) -> Result<(), ProcessorMismatch> {
        let expected = match method {
            CaptureMethod::Automatic => ProcessorChargeStatus::Succeeded,
            CaptureMethod::Manual => ProcessorChargeStatus::RequiresCapture,
        };
        ProcessorMismatch::check_as(expected, &self.id, self.status, self.money, requested)
    }
}

/// The processor's definitive answer about a key, from [`CardProcessor::cancel`] (`T` is a
/// [`ProcessorCharge`]) or [`CardProcessor::cancel_refund`] (a [`ProcessorRefund`]). Generic
/// over what exists under the key, because every kind of key the processor deduplicates
/// settles by the same protocol; only what a call under it makes differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome<T> {
    /// It exists under the key (for a charge key, the charge): it was made, and must be
    /// recorded.
    Exists(T),
    /// A call under the key is still being processed: ask again later.
    StillProcessing,
    /// Nothing exists under the key, and the key is now tombstoned: no call under it can ever
    /// move money.
    Canceled,
}

/// The ways a charge or a refund does not succeed, which the service treats very differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessorError {
    /// A definitive business outcome (a card decline, a refund the processor refuses): stored
    /// and replayed like a success.
    #[error("declined ({decline_code}): {message}")]
    Declined {
        decline_code: String,
        message: String,
    },
    /// Nothing is known to have happened: a timeout, a connection error, a 5xx, a call still
    /// processing under the key. The outcome is unknown, and only the same key can tell.
    #[error("processor unavailable: {reason}")]
    Unavailable { reason: String },
}

/// The port the charge flow and the completer call. Object-safe so the service can pick an
/// implementation at start-up.
#[async_trait]
pub trait CardProcessor: Send + Sync + std::fmt::Debug + 'static {
    /// Creates the charge, or returns the one already created under the same idempotency key.
    async fn charge(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError>;

    /// Looks up the charge created under `idempotency_key` without ever creating one. `None`
    /// is not definitive: a call under the key may still be processing.
    async fn find_charge(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorCharge>, ProcessorError>;

    /// Settles `idempotency_key` for good: returns its charge if one exists, says so if a call
    /// is still processing, and otherwise tombstones the key so that nothing can ever be
    /// charged under it.
    async fn cancel(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCharge>, ProcessorError>;

    /// Refunds part or all of a charge, or returns the refund already made under the same
    /// idempotency key. A refund the processor refuses for good is
    /// [`ProcessorError::Declined`], kept and replayed like a card decline.
    async fn refund(
        &self,
        request: ProcessorRefundRequest,
    ) -> Result<ProcessorRefund, ProcessorError>;

    /// Looks up the refund made under `idempotency_key` without ever making one. `None` is not
    /// definitive: a call under the key may still be processing.
    async fn find_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorRefund>, ProcessorError>;

    /// Settles a refund key for good, as [`CardProcessor::cancel`] does a charge key: its
    /// refund, "still processing", or a tombstone so that nothing can ever be refunded under it.
    async fn cancel_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorRefund>, ProcessorError>;

    /// Authorises the charge without capturing it (its status `requires_capture`), or returns
    /// the one already made under the same key. Charge keys and authorisation keys are one
    /// kind: [`CardProcessor::cancel`] settles either.
    async fn authorize(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError>;

    /// Captures an authorisation, or returns the capture already made under the same key. An
    /// authorisation is captured at most once, and never once voided: a capture its state
    /// forbids is [`ProcessorError::Declined`] with one of [`crate::decline`]'s codes.
    async fn capture(
        &self,
        request: ProcessorCaptureRequest,
    ) -> Result<ProcessorCapture, ProcessorError>;

    /// Settles a capture key for good, as [`CardProcessor::cancel`] does a charge key.
    async fn cancel_capture(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCapture>, ProcessorError>;

    /// Voids an authorisation, or returns the void already made under the same key. Never
    /// once captured: that is [`ProcessorError::Declined`] with one of [`crate::decline`]'s
    /// codes.
    async fn void(&self, request: ProcessorVoidRequest) -> Result<ProcessorVoid, ProcessorError>;

    /// Settles a void key for good, as [`CardProcessor::cancel`] does a charge key.
    async fn cancel_void(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorVoid>, ProcessorError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Amount, Currency};

    fn money(minor_units: i64, currency: Currency) -> Money {
        Money::new(
            Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}")),
            currency,
        )
    }

    fn charge(money: Money, status: ProcessorChargeStatus) -> ProcessorCharge {
        ProcessorCharge {
            id: "ch_1".into(),
            money,
            status,
        }
    }

    #[test]
    fn confirms_accepts_a_succeeded_charge_for_exactly_the_requested_money() {
        let requested = money(1999, Currency::Usd);
        let charge = charge(requested, ProcessorChargeStatus::Succeeded);
        assert_eq!(charge.confirms(requested), Ok(()));
    }

    #[test]
    fn confirms_refuses_a_charge_that_did_not_succeed() {
        let requested = money(1999, Currency::Usd);
        for (status, name) in [
            (ProcessorChargeStatus::Pending, "pending"),
            (ProcessorChargeStatus::Failed, "failed"),
        ] {
            assert_eq!(
                charge(requested, status).confirms(requested),
                Err(ProcessorMismatch::NotSucceeded {
                    id: "ch_1".into(),
                    status: name,
                })
            );
        }
    }

    #[test]
    fn confirms_refuses_another_amount_or_currency() {
        let requested = money(1999, Currency::Usd);
        for reported in [money(2000, Currency::Usd), money(1999, Currency::Eur)] {
            assert_eq!(
                charge(reported, ProcessorChargeStatus::Succeeded).confirms(requested),
                Err(ProcessorMismatch::Money {
                    id: "ch_1".into(),
                    reported,
                    requested,
                })
            );
        }
    }

    #[test]
    fn status_names_round_trip_and_unknown_names_are_none() {
        for (status, name) in [
            (ProcessorChargeStatus::Succeeded, "succeeded"),
            (ProcessorChargeStatus::Pending, "pending"),
            (ProcessorChargeStatus::Failed, "failed"),
        ] {
            assert_eq!(status.as_str(), name);
            assert_eq!(ProcessorChargeStatus::parse(name), Some(status));
        }
        assert_eq!(ProcessorChargeStatus::parse("Succeeded"), None);
        assert_eq!(ProcessorChargeStatus::parse("refunded"), None);
    }
}
