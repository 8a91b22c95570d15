//! Refunds: giving back part or all of a charge. The request and the refund as the service
//! records it, and the refund at the card processor, on the same exactly-once protocol as
//! charges (an idempotency key per refund, a lookup, a cancel that tombstones).

use chrono::{DateTime, Utc};

use crate::{
    Amount, ChargeId, Money, ProcessorChargeStatus, ProcessorMetadata, ProcessorMismatch, RefundId,
    TenantId,
};

/// Why a refund was made, as the merchant states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefundReason {
    RequestedByCustomer,
    Duplicate,
    Fraudulent,
}

impl RefundReason {
    pub const ALL: [Self; 3] = [Self::RequestedByCustomer, Self::Duplicate, Self::Fraudulent];

    /// The name on the wire and in the database.
    pub fn name(self) -> &'static str {
        match self {
            Self::RequestedByCustomer => "requested_by_customer",
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// A validated request to refund a charge: how much (all that is still refundable when no
/// amount is given) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    pub charge: ChargeId,
    pub amount: Option<Amount>,
    pub reason: Option<RefundReason>,
}

/// Where a refund stands. A pending refund holds its amount reserved on the charge and has no
/// processor refund yet; only a succeeded one has given money back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundStatus {
    Pending,
    Succeeded { processor_refund_id: String },
}

/// A refund of a charge, as the service records and shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    pub id: RefundId,
    pub tenant: TenantId,
    pub charge: ChargeId,
    /// In the charge's currency, never more than what remained refundable when it was made.
    pub money: Money,
    pub reason: Option<RefundReason>,
    pub status: RefundStatus,
    pub created_at: DateTime<Utc>,
}

impl Refund {
    /// This pending refund, made at the processor as `processor_refund_id`.
    pub fn succeeded(&self, processor_refund_id: String) -> Self {
        Self {
            status: RefundStatus::Succeeded {
                processor_refund_id,
            },
            ..self.clone()
        }
    }
}

/// A refund to make at the processor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorRefundRequest {
    /// Deterministic per idempotency record: every attempt of one request sends the same key.
    pub idempotency_key: String,
    /// The processor's id of the charge to refund, as it reported it.
    pub processor_charge_id: String,
    pub money: Money,
    /// The tenant and the refund's id in the service, kept by the processor with the refund.
    pub metadata: ProcessorMetadata,
}

/// The status a processor reports for a refund: the same states and wire names as a charge's,
/// so one type serves both and the two cannot drift apart. Only `Succeeded` is ever recorded.
pub type ProcessorRefundStatus = ProcessorChargeStatus;

/// A refund the processor made (or had already made under the same key), as the processor
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorRefund {
    pub id: String,
    /// The charge the processor says it refunded.
    pub processor_charge_id: String,
    pub money: Money,
    pub status: ProcessorRefundStatus,
}

impl ProcessorRefund {
    /// Accepts the refund as the one requested only if it succeeded, of exactly the requested
    /// charge, for exactly the requested amount and currency. A refund of another charge is
    /// checked first: its money would be compared with the wrong charge's.
    pub fn confirms(
        &self,
        requested_charge_id: &str,
        requested_money: Money,
    ) -> Result<(), ProcessorMismatch> {
        if self.processor_charge_id != requested_charge_id {
            return Err(ProcessorMismatch::Charge {
                id: self.id.clone(),
                reported: self.processor_charge_id.clone(),
                requested: requested_charge_id.to_owned(),
            });
        }
        ProcessorMismatch::check(&self.id, self.status, self.money, requested_money)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Amount, Currency};

    fn usd(minor_units: i64) -> Money {
        let amount = Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}"));
        Money::new(amount, Currency::Usd)
    }

    /// A refund of `ch_1` for 5.00 USD that succeeded, changed by `change`.
    fn reported(change: impl FnOnce(&mut ProcessorRefund)) -> ProcessorRefund {
        let mut refund = ProcessorRefund {
            id: "re_1".into(),
            processor_charge_id: "ch_1".into(),
            money: usd(500),
            status: ProcessorRefundStatus::Succeeded,
        };
        change(&mut refund);
        refund
    }

    #[test]
    fn confirms_accepts_a_succeeded_refund_of_the_requested_charge_and_money() {
        assert_eq!(reported(|_| ()).confirms("ch_1", usd(500)), Ok(()));
    }

    /// One row per way a reported refund can differ from the request; each is refused, and
    /// a refund of another charge is refused as such whatever its money.
    #[test]
    fn confirms_refuses_every_other_refund() {
        let euros = Money::new(usd(500).amount, Currency::Eur);
        let not_succeeded = |status: &'static str| ProcessorMismatch::NotSucceeded {
            id: "re_1".into(),
            status,
        };
        let other_money = |reported: Money| ProcessorMismatch::Money {
            id: "re_1".into(),
            reported,
            requested: usd(500),
        };
        let other_charge = ProcessorMismatch::Charge {
            id: "re_1".into(),
            reported: "ch_2".into(),
            requested: "ch_1".into(),
        };
        let cases = [
            (
                reported(|r| r.status = ProcessorRefundStatus::Pending),
                not_succeeded("pending"),
            ),
            (
                reported(|r| r.status = ProcessorRefundStatus::Failed),
                not_succeeded("failed"),
            ),
            (reported(|r| r.money = usd(501)), other_money(usd(501))),
            (reported(|r| r.money = euros), other_money(euros)),
            (
                reported(|r| r.processor_charge_id = "ch_2".into()),
                other_charge.clone(),
            ),
            (
                reported(|r| {
                    r.processor_charge_id = "ch_2".into();
                    r.money = usd(501);
                }),
                other_charge,
            ),
        ];
        for (refund, refused) in cases {
            assert_eq!(
                refund.confirms("ch_1", usd(500)),
                Err(refused),
                "{refund:?}"
            );
        }
    }
}
