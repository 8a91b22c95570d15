//! The refund rules: what each charge can still give back, and how a refund call under a key
//! that has no definitive answer yet will end. Everything is decided when the call begins, under
//! the simulator's one mutex, and a refund that may succeed reserves its amount at once: two
//! concurrent refunds under different keys can never give back more than the charge took.
//! An authorisation took nothing until it is captured, and then only what its capture took.

use std::collections::HashMap;

use payments_domain::{
    Money, ProcessorCapture, ProcessorCharge, ProcessorChargeStatus, ProcessorRefund,
    ProcessorRefundStatus,
};
use uuid::Uuid;

use super::{Outcome, RefundCall};
use crate::TestToken;

/// A charge that exists, as far as its refunds are concerned.
#[derive(Debug)]
struct RefundableCharge {
    /// What the charge took, as the processor recorded it: all of it for a charge captured
    /// when it was made, what its capture took for an authorisation, and `None` while an
    /// authorisation is not captured (held, or voided).
    captured: Option<Money>,
    /// The token it was made with: it decides whether its refunds are declined, and how long
    /// they process.
    token: TestToken,
    /// Minor units already refunded, or reserved by refunds still processing.
    committed: i64,
}

/// What one processing refund holds until it settles.
#[derive(Debug)]
struct Reservation {
    charge_id: String,
    minor_units: i64,
}

/// The charges that can be refunded, and the reservations of the refunds in flight.
#[derive(Debug, Default)]
pub(crate) struct Refundable {
    /// By processor charge id.
    charges: HashMap<String, RefundableCharge>,
    /// By refund idempotency key.
    reservations: HashMap<String, Reservation>,
}

impl Refundable {
    /// Makes a charge that has just come into existence refundable; an authorisation
    /// (`requires_capture`) only once [`Refundable::capture`] says what its capture took.
    pub(crate) fn add(&mut self, charge: &ProcessorCharge, token: TestToken) {
        let captured = match charge.status {
            ProcessorChargeStatus::RequiresCapture => None,
            _ => Some(charge.money),
        };
        let refundable = RefundableCharge {
            captured,
            token,
            committed: 0,
        };
        self.charges.insert(charge.id.clone(), refundable);
    }

    /// Makes the authorisation `capture` took refundable, up to what it took: called once the
    /// capture has come into existence. A charge forgotten since changes nothing.
    pub(crate) fn capture(&mut self, capture: &ProcessorCapture) {
        if let Some(refundable) = self.charges.get_mut(&capture.processor_charge_id) {
            refundable.captured = Some(capture.money);
        }
    }

    /// Forgets the charge `charge_id`, which its key window has let go: from now on it is
    /// no such charge.
    pub(crate) fn forget(&mut self, charge_id: &str) {
        self.charges.remove(charge_id);
    }

    /// The number of charges that can be refunded.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.charges.len()
    }

    /// The token the charge `charge_id` was made with; `None` for a charge that does not exist.
    pub(crate) fn token_of(&self, charge_id: &str) -> Option<TestToken> {
        self.charges
            .get(charge_id)
            .map(|refundable| refundable.token)
    }

    /// The outcome of `request`, reserving its amount if it is to succeed. The checks run in
    /// this order because each needs the one before: a charge to refund, money it took (an
    /// authorisation not captured took none), refunds not all declined, the same currency
    /// (amounts in two currencies do not compare), then an amount within what remains.
    pub(crate) fn begin(&mut self, request: &RefundCall) -> Outcome<ProcessorRefund> {
        let charge_id = &request.processor_charge_id;
        let Some(refundable) = self.charges.get_mut(charge_id) else {
            return Outcome::declined("no_such_charge", format!("No such charge: {charge_id}."));
        };
        let Some(charged) = refundable.captured else {
            return Outcome::declined(
                NOT_CAPTURED,
                format!("The charge {charge_id} is not captured: it took nothing to give back."),
            );
        };
        if refundable.token == TestToken::DeclinesRefunds {
            return Outcome::declined("refund_declined", "The refund was declined.".to_owned());
        }
        let requested = request.money;
        if requested.currency != charged.currency {
            return Outcome::declined(
                "currency_mismatch",
                format!(
                    "The refund is in {}, the charge in {}.",
                    requested.currency, charged.currency
                ),
            );
        }
        let remaining = charged.amount.minor_units() - refundable.committed;
        let minor_units = requested.amount.minor_units();
        if minor_units > remaining {
            return Outcome::declined(
                "amount_too_large",
                format!(
                    "The refund of {requested} is larger than the {remaining} minor units that \
                     remain of the charge."
                ),
            );
        }
        refundable.committed += minor_units;
        let reservation = Reservation {
            charge_id: charge_id.clone(),
            minor_units,
        };
        self.reservations
            .insert(request.idempotency_key.clone(), reservation);
        Outcome::Succeeded(ProcessorRefund {
            id: format!("re_{}", Uuid::new_v4().simple()),
            processor_charge_id: charge_id.clone(),
            money: requested,
            status: ProcessorRefundStatus::Succeeded,
        })
    }

    /// Ends the reservation of the refund under `key`: a success keeps its amount refunded for
    /// good, any other outcome gives it back to the charge.
    pub(crate) fn settle(&mut self, key: &str, outcome: &Outcome<ProcessorRefund>) {
        let Some(reservation) = self.reservations.remove(key) else {
            return;
        };
        if matches!(outcome, Outcome::Succeeded(_)) {
            return;
        }
        if let Some(refundable) = self.charges.get_mut(&reservation.charge_id) {
            refundable.committed -= reservation.minor_units;
        }
    }
}

/// The `decline_code` of a refund of an authorisation that is not captured.
pub(crate) const NOT_CAPTURED: &str = "charge_not_captured";

#[cfg(test)]
mod tests {
    use payments_domain::{Amount, Currency, ProcessorChargeStatus};

    use super::*;

    fn usd(minor_units: i64) -> Money {
        Money::new(
            Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}")),
            Currency::Usd,
        )
    }

    /// A book with one refundable 1.00 USD charge, `ch_1`.
    fn refundable() -> Refundable {
        let mut refundable = Refundable::default();
        let charge = ProcessorCharge {
            id: "ch_1".into(),
            money: usd(100),
            status: ProcessorChargeStatus::Succeeded,
        };
        refundable.add(&charge, TestToken::Succeeds);
        refundable
    }

    fn refund_of_everything(key: &str) -> RefundCall {
        RefundCall {
            idempotency_key: key.into(),
            processor_charge_id: "ch_1".into(),
            money: usd(100),
            metadata: None,
        }
    }

    fn is_too_large(outcome: &Outcome<ProcessorRefund>) -> bool {
        matches!(outcome, Outcome::Declined { decline_code, .. } if decline_code == "amount_too_large")
    }

    #[test]
    fn a_refund_that_fails_transiently_gives_its_reservation_back() {
        let mut refundable = refundable();
        let first = refundable.begin(&refund_of_everything("a"));
        assert!(matches!(first, Outcome::Succeeded(_)), "{first:?}");
        // While it is processing, its amount is taken.
        assert!(is_too_large(&refundable.begin(&refund_of_everything("b"))));

        let failed = Outcome::FailedTransiently {
            reason: "simulated".into(),
        };
        refundable.settle("a", &failed);
        let retry = refundable.begin(&refund_of_everything("a"));
        assert!(matches!(retry, Outcome::Succeeded(_)), "{retry:?}");
    }

    #[test]
    fn a_refund_that_succeeds_keeps_its_amount_for_good() {
        let mut refundable = refundable();
        let refund = refundable.begin(&refund_of_everything("a"));
        refundable.settle("a", &refund);
        // Settling twice, or a key that reserved nothing, changes nothing.
        refundable.settle("a", &refund);
        refundable.settle("never", &refund);

        assert!(is_too_large(&refundable.begin(&refund_of_everything("b"))));
        assert_eq!(refundable.token_of("ch_1"), Some(TestToken::Succeeds));
        assert_eq!(refundable.token_of("ch_2"), None);
    }
}
