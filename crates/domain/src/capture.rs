//! Authorise now, capture later: a charge made with [`CaptureMethod::Manual`] only holds its
//! amount on the card until it is captured (all of it or less, once) or canceled, and at the
//! latest by its `capture_before`. Uncaptured money is never the tenant's: nothing of it can be
//! refunded or paid out. At the processor a capture and a void are effects of their own, on the
//! same exactly-once protocol as charges (a key per call, a cancel that tombstones), and the
//! processor lets exactly one of them happen to an authorisation.

use chrono::{DateTime, Utc};

use crate::{Amount, ChargeId, Money, ProcessorMetadata, ProcessorMismatch};

/// How a charge takes its money: at once (the default), or held until a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CaptureMethod {
    #[default]
    Automatic,
    Manual,
}

/// Why an authorisation was canceled: the merchant's reasons, as Stripe names them, and
/// `expired` for the holds the service cancels itself once their `capture_before` has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancellationReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
    /// Not a client's to send: the service cancels a hold past its `capture_before`.
    Expired,
}

impl CancellationReason {
    pub const ALL: [Self; 5] = [
        Self::Duplicate,
        Self::Fraudulent,
        Self::RequestedByCustomer,
        Self::Abandoned,
        Self::Expired,
    ];

    /// The reasons a client may give.
    pub const GIVEN_BY_CLIENTS: [Self; 4] = [
        Self::Duplicate,
        Self::Fraudulent,
        Self::RequestedByCustomer,
        Self::Abandoned,
    ];

    /// The name on the wire and in the database.
    pub fn name(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
            Self::Abandoned => "abandoned",
            Self::Expired => "expired",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// Where a charge's money stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capture {
    /// Captured in full when it was made: every charge made without `"capture": false`.
    Automatic,
    /// Authorised, and held until `capture_before`.
    Manual {
        capture_before: DateTime<Utc>,
        state: ManualCapture,
    },
}

/// What became of an authorisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManualCapture {
    /// Held, waiting for a capture or a cancel.
    RequiresCapture,
    /// Captured: `amount` of it, and the rest of the hold released.
    Captured { amount: Amount },
    /// Voided at the processor: nothing was taken.
    Canceled { reason: Option<CancellationReason> },
}

impl Capture {
    /// A hold until `capture_before`.
    pub fn held_until(capture_before: DateTime<Utc>) -> Self {
        Self::Manual {
            capture_before,
            state: ManualCapture::RequiresCapture,
        }
    }

    /// The status a charge shows: `succeeded` once its money is taken, `requires_capture`
    /// while it is held, `canceled` once the hold is voided.
    pub fn status(&self) -> &'static str {
        match self {
            Self::Automatic
            | Self::Manual {
                state: ManualCapture::Captured { .. },
                ..
            } => "succeeded",
            Self::Manual {
                state: ManualCapture::RequiresCapture,
                ..
            } => "requires_capture",
            Self::Manual {
                state: ManualCapture::Canceled { .. },
                ..
            } => "canceled",
        }
    }
}

/// A validated request to capture a held charge: `amount` (all of the hold when none is
/// given) is taken, the rest released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureRequest {
    pub charge: ChargeId,
    pub amount: Option<Amount>,
}

/// A validated request to cancel a held charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelRequest {
    pub charge: ChargeId,
    pub reason: Option<CancellationReason>,
}

/// A capture to make at the processor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorCaptureRequest {
    /// Deterministic per idempotency record: every attempt of one request sends the same key.
    pub idempotency_key: String,
    /// The processor's id of the authorisation to capture.
    pub processor_charge_id: String,
    /// What to take: at most what was authorised.
    pub money: Money,
    /// The tenant and the charge's id in the service.
    pub metadata: ProcessorMetadata,
}

/// A capture the processor made (or had already made under the same key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorCapture {
    pub id: String,
    pub processor_charge_id: String,
    pub money: Money,
}

impl ProcessorCapture {
    /// Accepts the capture only if it took exactly the requested money of exactly the
    /// requested authorisation.
    pub fn confirms(
        &self,
        requested_charge_id: &str,
        requested_money: Money,
    ) -> Result<(), ProcessorMismatch> {
        confirms_end(
            (&self.id, &self.processor_charge_id, self.money),
            requested_charge_id,
            requested_money,
        )
    }
}

/// Accepts what ended an authorisation (its id, the authorisation it names, the money it took or
/// released) only if it is of exactly the requested authorisation, for exactly the requested
/// money.
fn confirms_end(
    (id, reported_charge_id, reported_money): (&str, &str, Money),
    requested_charge_id: &str,
    requested_money: Money,
) -> Result<(), ProcessorMismatch> {
    if reported_charge_id != requested_charge_id {
        return Err(ProcessorMismatch::Charge {
            id: id.to_owned(),
            reported: reported_charge_id.to_owned(),
            requested: requested_charge_id.to_owned(),
        });
    }
    if reported_money != requested_money {
        return Err(ProcessorMismatch::Money {
            id: id.to_owned(),
            reported: reported_money,
            requested: requested_money,
        });
    }
    Ok(())
}

/// A void to make at the processor: the authorisation is released, and can never be captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorVoidRequest {
    pub idempotency_key: String,
    pub processor_charge_id: String,
    pub metadata: ProcessorMetadata,
}

/// A void the processor made (or had already made under the same key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorVoid {
    pub id: String,
    pub processor_charge_id: String,
    /// What it released: all the authorisation held.
    pub money: Money,
}

impl ProcessorVoid {
    /// Accepts the void only if it released exactly what the requested authorisation held.
    pub fn confirms(
        &self,
        requested_charge_id: &str,
        held: Money,
    ) -> Result<(), ProcessorMismatch> {
        confirms_end(
            (&self.id, &self.processor_charge_id, self.money),
            requested_charge_id,
            held,
        )
    }
}

/// The processor's decline codes for a capture or a void the authorisation's state forbids:
/// stable, so that the service can tell its clients which it met.
pub mod decline {
    /// The authorisation was captured already (under another key).
    pub const ALREADY_CAPTURED: &str = "charge_already_captured";
    /// The authorisation was voided already (under another key).
    pub const CANCELED: &str = "charge_canceled";
    /// More than the authorisation holds.
    pub const AMOUNT_TOO_LARGE: &str = "amount_too_large";
    /// The charge was not an authorisation (it was captured when it was made), or is unknown.
    pub const NOT_CAPTURABLE: &str = "charge_not_capturable";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Currency;

    fn usd(minor_units: i64) -> Money {
        Money::new(
            Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}")),
            Currency::Usd,
        )
    }

    #[test]
    fn reasons_round_trip_and_clients_cannot_give_expired() {
        for reason in CancellationReason::ALL {
            assert_eq!(CancellationReason::from_name(reason.name()), Some(reason));
        }
        assert!(!CancellationReason::GIVEN_BY_CLIENTS.contains(&CancellationReason::Expired));
        assert_eq!(CancellationReason::from_name("Expired"), None);
    }

    #[test]
    fn a_charge_shows_succeeded_only_once_its_money_is_taken() {
        let before = Utc::now();
        let manual = |state| Capture::Manual {
            capture_before: before,
            state,
        };
        assert_eq!(Capture::Automatic.status(), "succeeded");
        assert_eq!(Capture::held_until(before).status(), "requires_capture");
        let captured = ManualCapture::Captured {
            amount: usd(1).amount,
        };
        assert_eq!(manual(captured).status(), "succeeded");
        let canceled = ManualCapture::Canceled { reason: None };
        assert_eq!(manual(canceled).status(), "canceled");
    }

    #[test]
    fn a_capture_or_void_confirms_only_its_authorisation_and_money() {
        let capture = ProcessorCapture {
            id: "cap_1".into(),
            processor_charge_id: "ch_1".into(),
            money: usd(500),
        };
        assert_eq!(capture.confirms("ch_1", usd(500)), Ok(()));
        assert!(capture.confirms("ch_2", usd(500)).is_err());
        assert!(capture.confirms("ch_1", usd(499)).is_err());
        let void = ProcessorVoid {
            id: "void_1".into(),
            processor_charge_id: "ch_1".into(),
            money: usd(500),
        };
        assert_eq!(void.confirms("ch_1", usd(500)), Ok(()));
        assert!(void.confirms("ch_2", usd(500)).is_err());
        assert!(void.confirms("ch_1", usd(499)).is_err());
    }
}
