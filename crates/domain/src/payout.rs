//! Payouts: money sent from a tenant's balance to one of its bank accounts. The request and
//! the payout as the service records it, and the payout at the processor with the port that
//! sends it, on the same settle protocol as charges and refunds.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::card_number::{ReferenceRefusal, check_reference};
use crate::{
    CancelOutcome, Description, Money, PayoutId, ProcessorChargeStatus, ProcessorError,
    ProcessorMetadata, ProcessorMismatch, TenantId,
};

/// The bank account a payout goes to (`ba_...`): an opaque reference to an account the tenant
/// registered with the processor, never an account or card number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination(String);

impl Destination {
    /// The longest reference accepted.
    pub const MAX_LEN: usize = 255;
    /// What every bank account reference starts with.
    pub const PREFIX: &str = "ba_";

    /// A destination is `ba_` and then up to 252 ASCII letters, digits and underscores, and
    /// holds no card number: a client that sends one is told so (a PCI matter), not merely that
    /// the reference is malformed.
    pub fn new(reference: impl Into<String>) -> Result<Self, DestinationError> {
        let reference = reference.into();
        match check_reference(&reference, Self::PREFIX, Self::MAX_LEN) {
            Ok(()) => Ok(Self(reference)),
            Err(ReferenceRefusal::CardNumber) => Err(DestinationError::CardNumber),
            Err(ReferenceRefusal::Malformed) => Err(DestinationError::NotABankAccount),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a destination was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error("a card number is not accepted; send the bank account's reference (ba_...) instead")]
    CardNumber,
    #[error(
        "destination must be a bank account reference: ba_ and then letters, digits or \
         underscores, at most {} characters in all",
        Destination::MAX_LEN
    )]
    NotABankAccount,
}

/// A validated request to pay `money` out of the tenant's balance to `destination`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutRequest {
    pub money: Money,
    pub destination: Destination,
    pub description: Option<Description>,
}

/// Where a payout stands. A pending payout holds its amount reserved on the tenant's balance
/// and has no processor payout yet; only a paid one has sent money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayoutStatus {
    Pending,
    Paid { processor_payout_id: String },
}

/// A payout, as the service records and shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payout {
    pub id: PayoutId,
    pub tenant: TenantId,
    /// Never more than the tenant's balance held when it was reserved.
    pub money: Money,
    pub destination: Destination,
    pub description: Option<Description>,
    pub status: PayoutStatus,
    pub created_at: DateTime<Utc>,
}

impl Payout {
    /// This pending payout, paid at the processor as `processor_payout_id`.
    pub fn paid(&self, processor_payout_id: String) -> Self {
        Self {
            status: PayoutStatus::Paid {
                processor_payout_id,
            },
            ..self.clone()
        }
    }
}

/// A payout to make at the processor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorPayoutRequest {
    /// Deterministic per idempotency record: every attempt of one request sends the same key.
    pub idempotency_key: String,
    pub money: Money,
    pub destination: Destination,
    /// The tenant and the payout's id in the service, kept by the processor with the payout.
    pub metadata: ProcessorMetadata,
}

/// The status a processor reports for a payout: the charge's, since only `Succeeded` (paid)
/// is ever recorded.
pub type ProcessorPayoutStatus = ProcessorChargeStatus;

/// A payout the processor made (or had already made under the same key), as it reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorPayout {
    pub id: String,
    /// The bank account the processor says it paid.
    pub destination: String,
    pub money: Money,
    pub status: ProcessorPayoutStatus,
}

impl ProcessorPayout {
    /// Accepts the payout as the one requested only if it succeeded, to exactly the requested
    /// destination, for exactly the requested amount and currency. Another destination is
    /// checked first: its money would be compared with the wrong account's.
    pub fn confirms(
        &self,
        requested_destination: &Destination,
        requested_money: Money,
    ) -> Result<(), ProcessorMismatch> {
        if self.destination != requested_destination.as_str() {
            return Err(ProcessorMismatch::Destination {
                id: self.id.clone(),
                reported: self.destination.clone(),
                requested: requested_destination.as_str().to_owned(),
            });
        }
        ProcessorMismatch::check(&self.id, self.status, self.money, requested_money)
    }
}

/// The port the payout operation and the completer call, with the contract of
/// [`CardProcessor`](crate::CardProcessor): the same `idempotency_key` never makes a second
/// payout, a timeout is [`ProcessorError::Unavailable`], and only a cancel can say "nothing
/// under this key, and never will be". A payout the processor refuses for good (a closed
/// account) is [`ProcessorError::Declined`], kept and replayed.
#[async_trait]
pub trait PayoutProcessor: Send + Sync + std::fmt::Debug + 'static {
    /// Makes the payout, or returns the one already made under the same idempotency key.
    async fn payout(
        &self,
        request: ProcessorPayoutRequest,
    ) -> Result<ProcessorPayout, ProcessorError>;

    /// Looks up the payout made under `idempotency_key` without ever making one. `None` is not
    /// definitive: a call under the key may still be processing.
    async fn find_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorPayout>, ProcessorError>;

    /// Settles a payout key for good: its payout, "still processing", or a tombstone so that
    /// nothing can ever be paid out under it.
    async fn cancel_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorPayout>, ProcessorError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Amount, Currency};

    fn usd(minor_units: i64) -> Money {
        Money::new(
            Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}")),
            Currency::Usd,
        )
    }

    fn destination(reference: &str) -> Destination {
        Destination::new(reference).unwrap_or_else(|e| panic!("{e}"))
    }

    fn reported(change: impl FnOnce(&mut ProcessorPayout)) -> ProcessorPayout {
        let mut payout = ProcessorPayout {
            id: "po_1".into(),
            destination: "ba_checking".into(),
            money: usd(500),
            status: ProcessorPayoutStatus::Succeeded,
        };
        change(&mut payout);
        payout
    }

    #[test]
    fn a_destination_is_a_bank_account_reference_and_never_a_card_number() {
        assert_eq!(destination("ba_checking_2").as_str(), "ba_checking_2");
        for refused in [
            "",
            "ba_",
            "tok_visa",
            "ba_with space",
            "ba_é",
            &"ba_x".repeat(64),
        ] {
            assert_eq!(
                Destination::new(refused),
                Err(DestinationError::NotABankAccount),
                "{refused:?}"
            );
        }
        assert_eq!(
            Destination::new("ba_4242424242424242"),
            Err(DestinationError::CardNumber)
        );
        assert_eq!(
            Destination::new("4242 4242 4242 4242"),
            Err(DestinationError::CardNumber)
        );
    }

    #[test]
    fn confirms_accepts_a_paid_payout_to_the_requested_account_and_money() {
        let requested = destination("ba_checking");
        assert_eq!(reported(|_| ()).confirms(&requested, usd(500)), Ok(()));
    }

    #[test]
    fn confirms_refuses_another_account_another_amount_or_an_unpaid_payout() {
        let requested = destination("ba_checking");
        let elsewhere = reported(|p| p.destination = "ba_savings".into());
        assert!(matches!(
            elsewhere.confirms(&requested, usd(500)),
            Err(ProcessorMismatch::Destination { .. })
        ));
        assert!(matches!(
            reported(|_| ()).confirms(&requested, usd(501)),
            Err(ProcessorMismatch::Money { .. })
        ));
        let pending = reported(|p| p.status = ProcessorPayoutStatus::Pending);
        assert!(matches!(
            pending.confirms(&requested, usd(500)),
            Err(ProcessorMismatch::NotSucceeded { .. })
        ));
    }
}
