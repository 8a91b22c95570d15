//! The charge rules: how a charge call under a key that has no definitive answer yet will end,
//! chosen by its card token. An authorisation keeps exactly the same rules; only the status of
//! what it makes differs (`requires_capture`, not `succeeded`).

use payments_domain::{Amount, CaptureMethod, Money, ProcessorCharge, ProcessorChargeStatus};
use uuid::Uuid;

use super::Outcome;
use crate::TestToken;

/// The outcome of a charge of `money` with `token`, captured as `capture` says; `first_attempt`
/// is false for a retry of a key whose last call failed transiently.
pub(super) fn decide(
    token: TestToken,
    money: Money,
    capture: CaptureMethod,
    first_attempt: bool,
) -> Outcome<ProcessorCharge> {
    let declined = |decline_code: &str, message: &str| Outcome::Declined {
        decline_code: decline_code.to_owned(),
        message: message.to_owned(),
    };
    match token {
        TestToken::FailsTransiently => Outcome::FailedTransiently {
            reason: "simulated processing error".into(),
        },
        TestToken::FailsOnceThenSucceeds if first_attempt => Outcome::FailedTransiently {
            reason: "simulated processing error (once)".into(),
        },
        TestToken::Declined => declined("generic_decline", "The card was declined."),
        TestToken::Unknown => declined("invalid_token", "The card token is not recognised."),
        TestToken::ReportsWrongAmount => charged(off_by_one_unit(money), capture),
        TestToken::Succeeds
        | TestToken::SucceedsSlowly
        | TestToken::FailsOnceThenSucceeds
        | TestToken::DeclinesRefunds => charged(money, capture),
    }
}

fn charged(money: Money, capture: CaptureMethod) -> Outcome<ProcessorCharge> {
    let status = match capture {
        CaptureMethod::Automatic => ProcessorChargeStatus::Succeeded,
        CaptureMethod::Manual => ProcessorChargeStatus::RequiresCapture,
    };
    Outcome::Succeeded(ProcessorCharge {
        id: format!("sim_{}", Uuid::new_v4().simple()),
        money,
        status,
    })
}

/// One minor unit more than `money`, or one less at [`Amount::MAX`], where there is no more.
fn off_by_one_unit(money: Money) -> Money {
    let units = money.amount.minor_units();
    let wrong = Amount::new(units + 1)
        .or_else(|_| Amount::new(units - 1))
        .unwrap_or(money.amount);
    Money::new(wrong, money.currency)
}
