//! The capture and void rules: what became of each authorisation, and how a capture or a void
//! call under a key that has no definitive answer yet will end. Everything is decided when the
//! call begins, under the simulator's one mutex, and a capture or a void that is to succeed
//! changes its authorisation at once, long before it exists: of a capture and a void racing on
//! one authorisation, or of two captures under different keys, exactly one succeeds, and the
//! others are declined with one of [`decline`]'s codes.

use std::collections::HashMap;

use payments_domain::{Money, ProcessorCapture, ProcessorCharge, ProcessorVoid, decline};
use uuid::Uuid;

use super::{CaptureCall, Outcome, VoidCall};
use crate::TestToken;

/// What became of an authorisation, as far as its captures and voids are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Neither captured nor voided yet.
    RequiresCapture,
    /// A capture took it (or is taking it: the capture may still be within its latency).
    Captured,
    /// A void released it (or is releasing it).
    Voided,
}

/// An authorisation that exists.
#[derive(Debug)]
struct Authorization {
    /// What it holds, as the processor recorded it: a capture takes at most this.
    money: Money,
    /// The token it was made with: its captures and voids process as long as a call with it.
    token: TestToken,
    hold: Hold,
}

/// The authorisations that can be captured or voided, by processor charge id. A charge
/// captured when it was made is never here.
#[derive(Debug, Default)]
pub(crate) struct Capturable {
    authorizations: HashMap<String, Authorization>,
    /// Authorisations ever made, forgotten or not.
    created: u64,
}

impl Capturable {
    /// Holds an authorisation that has just come into existence, until a capture or a void.
    pub(crate) fn add(&mut self, charge: &ProcessorCharge, token: TestToken) {
        let authorization = Authorization {
            money: charge.money,
            token,
            hold: Hold::RequiresCapture,
        };
        self.authorizations.insert(charge.id.clone(), authorization);
        self.created += 1;
    }

    /// Forgets the authorisation `charge_id`, which its key window has let go: from now on it
    /// is no such authorisation, and nothing can capture or void it.
    pub(crate) fn forget(&mut self, charge_id: &str) {
        self.authorizations.remove(charge_id);
    }

    /// The number of authorisations ever made.
    pub(crate) fn created(&self) -> u64 {
        self.created
    }

    /// The number of authorisations remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.authorizations.len()
    }

    /// The token the authorisation `charge_id` was made with; `None` for none that exists.
    pub(crate) fn token_of(&self, charge_id: &str) -> Option<TestToken> {
        self.authorizations
            .get(charge_id)
            .map(|authorization| authorization.token)
    }

    /// The outcome of `call`, the authorisation captured at once if it is to succeed. The
    /// checks run in this order: an authorisation to capture, one neither captured nor voided
    /// by another key, the same currency (amounts in two currencies do not compare), then an
    /// amount within what it holds.
    pub(crate) fn capture(&mut self, call: &CaptureCall) -> Outcome<ProcessorCapture> {
        let charge_id = &call.processor_charge_id;
        let authorization = match self.held(charge_id) {
            Ok(authorization) => authorization,
            Err(refused) => return refused,
        };
        let (requested, held) = (call.money, authorization.money);
        if requested.currency != held.currency {
            return Outcome::declined(
                decline::NOT_CAPTURABLE,
                format!(
                    "The capture is in {}, the authorisation {charge_id} in {}.",
                    requested.currency, held.currency
                ),
            );
        }
        if requested.amount > held.amount {
            return Outcome::declined(
                decline::AMOUNT_TOO_LARGE,
                format!(
                    "The capture of {requested} is larger than the {held} authorised by \
                     {charge_id}."
                ),
            );
        }
        authorization.hold = Hold::Captured;
        Outcome::Succeeded(ProcessorCapture {
            id: format!("cap_{}", Uuid::new_v4().simple()),
            processor_charge_id: charge_id.clone(),
            money: requested,
        })
    }

    /// The outcome of `call`, the authorisation voided at once if it is to succeed.
    pub(crate) fn void(&mut self, call: &VoidCall) -> Outcome<ProcessorVoid> {
        let charge_id = &call.processor_charge_id;
        let authorization = match self.held(charge_id) {
            Ok(authorization) => authorization,
            Err(refused) => return refused,
        };
        authorization.hold = Hold::Voided;
        Outcome::Succeeded(ProcessorVoid {
            id: format!("void_{}", Uuid::new_v4().simple()),
            processor_charge_id: charge_id.clone(),
            money: authorization.money,
        })
    }

    /// The authorisation `charge_id` if it is still held; else why neither a capture nor a
    /// void can have it.
    fn held<T>(&mut self, charge_id: &str) -> Result<&mut Authorization, Outcome<T>> {
        let Some(authorization) = self.authorizations.get_mut(charge_id) else {
            return Err(Outcome::declined(
                decline::NOT_CAPTURABLE,
                format!(
                    "No authorisation {charge_id}: the charge is unknown, or was captured when \
                     it was made."
                ),
            ));
        };
        match authorization.hold {
            Hold::RequiresCapture => Ok(authorization),
            Hold::Captured => Err(Outcome::declined(
                decline::ALREADY_CAPTURED,
                format!("The charge {charge_id} has already been captured."),
            )),
            Hold::Voided => Err(Outcome::declined(
                decline::CANCELED,
                format!("The charge {charge_id} has been voided."),
            )),
        }
    }
}

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

    /// One 1.00 USD authorisation, `ch_1`.
    fn capturable() -> Capturable {
        let mut capturable = Capturable::default();
        let authorization = ProcessorCharge {
            id: "ch_1".into(),
            money: usd(100),
            status: ProcessorChargeStatus::RequiresCapture,
        };
        capturable.add(&authorization, TestToken::Succeeds);
        capturable
    }

    fn capture_of(key: &str, money: Money) -> CaptureCall {
        CaptureCall {
            idempotency_key: key.into(),
            processor_charge_id: "ch_1".into(),
            money,
            metadata: None,
        }
    }

    fn void_of(key: &str) -> VoidCall {
        VoidCall {
            idempotency_key: key.into(),
            processor_charge_id: "ch_1".into(),
            metadata: None,
        }
    }

    fn decline_code<T>(outcome: &Outcome<T>) -> Option<&str> {
        match outcome {
            Outcome::Declined { decline_code, .. } => Some(decline_code),
            _ => None,
        }
    }

    #[test]
    fn a_void_after_a_capture_is_declined_and_a_capture_after_a_void_too() {
        let mut captured = capturable();
        let capture = captured.capture(&capture_of("a", usd(40)));
        assert!(matches!(capture, Outcome::Succeeded(_)), "{capture:?}");
        let void = captured.void(&void_of("b"));
        assert_eq!(decline_code(&void), Some(decline::ALREADY_CAPTURED));

        let mut voided = capturable();
        assert!(matches!(voided.void(&void_of("a")), Outcome::Succeeded(_)));
        let capture = voided.capture(&capture_of("b", usd(40)));
        assert_eq!(decline_code(&capture), Some(decline::CANCELED));
        let void = voided.void(&void_of("c"));
        assert_eq!(decline_code(&void), Some(decline::CANCELED));
    }

    #[test]
    fn a_refused_capture_leaves_the_authorisation_held() {
        let mut capturable = capturable();
        let euros = Money::new(usd(10).amount, Currency::Eur);
        let refused = [
            (capture_of("a", usd(101)), decline::AMOUNT_TOO_LARGE),
            (capture_of("b", euros), decline::NOT_CAPTURABLE),
            (
                CaptureCall {
                    processor_charge_id: "ch_unknown".into(),
                    ..capture_of("c", usd(10))
                },
                decline::NOT_CAPTURABLE,
            ),
        ];
        for (call, code) in refused {
            let outcome = capturable.capture(&call);
            assert_eq!(decline_code(&outcome), Some(code), "{call:?}");
        }
        let all = capturable.capture(&capture_of("d", usd(100)));
        assert!(matches!(all, Outcome::Succeeded(_)), "{all:?}");
        assert_eq!(capturable.created(), 1);
    }
}
