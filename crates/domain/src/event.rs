//! The events written to the outbox: `payment.completed` with every successful charge (or
//! capture of a held one), `payment.authorized` and `payment.canceled` with every hold made and
//! voided, `payment.refunded` with every successful refund, `payout.paid` with every paid
//! payout.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::{
    CancellationReason, Charge, ChargeId, Currency, Money, Payout, PayoutId, Refund, RefundId,
    TenantId,
};

/// The event type name of a charge on the wire.
pub const PAYMENT_COMPLETED: &str = "payment.completed";

/// The event type name of a hold made on a card (a charge made with `"capture": false`).
pub const PAYMENT_AUTHORIZED: &str = "payment.authorized";

/// The event type name of a hold voided (canceled, or expired).
pub const PAYMENT_CANCELED: &str = "payment.canceled";

/// The event type name of a refund on the wire.
pub const PAYMENT_REFUNDED: &str = "payment.refunded";

/// The event type name of a payout on the wire.
pub const PAYOUT_PAID: &str = "payout.paid";

/// The kinds of event, as `GET /events?type=` names them: a closed list, so that a query
/// naming anything else is refused rather than matched against the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    PaymentCompleted,
    PaymentRefunded,
    PayoutPaid,
    PaymentAuthorized,
    PaymentCanceled,
}

impl EventType {
    pub const ALL: [Self; 5] = [
        Self::PaymentCompleted,
        Self::PaymentRefunded,
        Self::PayoutPaid,
        Self::PaymentAuthorized,
        Self::PaymentCanceled,
    ];

    /// The name on the wire, in the stream and in the outbox.
    pub fn name(self) -> &'static str {
        match self {
            Self::PaymentCompleted => PAYMENT_COMPLETED,
            Self::PaymentRefunded => PAYMENT_REFUNDED,
            Self::PayoutPaid => PAYOUT_PAID,
            Self::PaymentAuthorized => PAYMENT_AUTHORIZED,
            Self::PaymentCanceled => PAYMENT_CANCELED,
        }
    }

    /// The type with this wire name, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

/// An event as it is published: consumers deduplicate on `event_id`, since delivery is at
/// least once, and read `schema_version` before anything else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event<T> {
    pub event_id: Uuid,
    pub schema_version: u32,
    #[serde(flatten)]
    pub payload: T,
}

impl<T> Event<T> {
    /// Every payload's schema version; bumped on any incompatible change.
    pub const SCHEMA_VERSION: u32 = 1;

    fn new(payload: T) -> Self {
        Self {
            event_id: Uuid::now_v7(),
            schema_version: Self::SCHEMA_VERSION,
            payload,
        }
    }
}

/// A charge succeeded.
pub type PaymentCompleted = Event<Payment>;

/// A hold was made on a card: the charge, and the money it holds.
pub type PaymentAuthorized = Event<Payment>;

/// A hold was voided: the charge, the money it held, and why.
pub type PaymentCanceled = Event<Canceled>;

/// A refund succeeded: the refund, and the part of its charge it gave back.
pub type PaymentRefunded = Event<Refunded>;

/// A payout was paid: money left the tenant's balance for one of its bank accounts.
pub type PayoutPaid = Event<PaidOut>;

/// Money that moved for a charge: the charge itself, or a refund of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Payment {
    pub charge_id: ChargeId,
    #[serde(serialize_with = "serialize_tenant")]
    pub tenant: TenantId,
    pub amount: i64,
    pub currency: Currency,
    pub occurred_at: DateTime<Utc>,
}

impl Payment {
    fn of(charge_id: ChargeId, tenant: &TenantId, money: Money, at: DateTime<Utc>) -> Self {
        Self {
            charge_id,
            tenant: tenant.clone(),
            amount: money.amount.minor_units(),
            currency: money.currency,
            occurred_at: at,
        }
    }
}

/// The payload of `payment.refunded`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refunded {
    pub refund_id: RefundId,
    #[serde(flatten)]
    pub payment: Payment,
}

impl PaymentCompleted {
    pub fn for_charge(charge: &Charge) -> Self {
        Self::new(Payment::of(
            charge.id,
            &charge.tenant,
            charge.money,
            charge.created_at,
        ))
    }
}

impl PaymentRefunded {
    pub fn for_refund(refund: &Refund) -> Self {
        Self::new(Refunded {
            refund_id: refund.id,
            payment: Payment::of(
                refund.charge,
                &refund.tenant,
                refund.money,
                refund.created_at,
            ),
        })
    }
}

/// The payload of `payment.canceled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Canceled {
    #[serde(flatten)]
    pub payment: Payment,
    pub cancellation_reason: Option<&'static str>,
}

impl PaymentCompleted {
    /// The capture of a held charge: the money it took, when it took it. Consumers of
    /// `payment.completed` see a captured hold as they see a charge captured at once.
    pub fn for_capture(charge: &Charge, captured: Money, at: DateTime<Utc>) -> Self {
        Self::new(Payment::of(charge.id, &charge.tenant, captured, at))
    }
}

impl PaymentAuthorized {
    pub fn for_authorization(charge: &Charge) -> Self {
        Self::new(Payment::of(
            charge.id,
            &charge.tenant,
            charge.money,
            charge.created_at,
        ))
    }
}

impl PaymentCanceled {
    pub fn for_cancel(
        charge: &Charge,
        reason: Option<CancellationReason>,
        at: DateTime<Utc>,
    ) -> Self {
        Self::new(Canceled {
            payment: Payment::of(charge.id, &charge.tenant, charge.money, at),
            cancellation_reason: reason.map(CancellationReason::name),
        })
    }
}

/// The payload of `payout.paid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaidOut {
    pub payout_id: PayoutId,
    #[serde(serialize_with = "serialize_tenant")]
    pub tenant: TenantId,
    pub amount: i64,
    pub currency: Currency,
    pub destination: String,
    pub occurred_at: DateTime<Utc>,
}

impl PayoutPaid {
    pub fn for_payout(payout: &Payout) -> Self {
        Self::new(PaidOut {
            payout_id: payout.id,
            tenant: payout.tenant.clone(),
            amount: payout.money.amount.minor_units(),
            currency: payout.money.currency,
            destination: payout.destination.as_str().to_owned(),
            occurred_at: payout.created_at,
        })
    }
}

fn serialize_tenant<S: serde::Serializer>(tenant: &TenantId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(tenant.as_str())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Amount, PaymentSource, RefundStatus};

    #[test]
    fn event_types_round_trip_through_their_names() {
        for kind in EventType::ALL {
            assert_eq!(EventType::from_name(kind.name()), Some(kind));
        }
        assert_eq!(EventType::from_name("payment.Completed"), None);
        assert_eq!(EventType::from_name(""), None);
    }

    #[test]
    fn events_carry_their_id_version_and_the_money_that_moved()
    -> Result<(), Box<dyn std::error::Error>> {
        let money = Money::new(Amount::new(2_500)?, Currency::Eur);
        let at = "2026-11-30T12:00:00Z".parse()?;
        let charge = Charge {
            id: ChargeId::generate(),
            tenant: TenantId::new("acme"),
            money,
            source: PaymentSource::new("tok_visa")?,
            description: None,
            processor_charge_id: "sim_1".into(),
            created_at: at,
            amount_refunded: 0,
            capture: crate::Capture::Automatic,
        };
        let completed = serde_json::to_value(PaymentCompleted::for_charge(&charge))?;
        assert_eq!(completed["schema_version"], 1);
        assert!(completed["event_id"].is_string());
        let payment = json!({
            "charge_id": charge.id.to_string(), "tenant": "acme", "amount": 2_500,
            "currency": "EUR", "occurred_at": "2026-11-30T12:00:00Z",
        });
        for (field, value) in payment.as_object().into_iter().flatten() {
            assert_eq!(&completed[field], value, "{field}");
        }

        let refund = Refund {
            id: RefundId::generate(),
            tenant: charge.tenant.clone(),
            charge: charge.id,
            money,
            reason: None,
            status: RefundStatus::Succeeded {
                processor_refund_id: "re_1".into(),
            },
            created_at: at,
        };
        let refunded = serde_json::to_value(PaymentRefunded::for_refund(&refund))?;
        assert_eq!(refunded["refund_id"], refund.id.to_string());
        assert_eq!(refunded["schema_version"], 1);
        for (field, value) in payment.as_object().into_iter().flatten() {
            assert_eq!(&refunded[field], value, "{field}");
        }
        Ok(())
    }
}
