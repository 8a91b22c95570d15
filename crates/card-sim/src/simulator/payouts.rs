//! The payout rules: how a payout call under a key that has no definitive answer yet will end,
//! chosen by its destination.

use payments_domain::{Destination, Money, ProcessorPayout, ProcessorPayoutStatus};
use uuid::Uuid;

use super::Outcome;
use crate::TestDestination;

/// The outcome of a payout of `money` to `destination`.
pub(super) fn decide(destination: &Destination, money: Money) -> Outcome<ProcessorPayout> {
    match TestDestination::from_destination(destination.as_str()) {
        TestDestination::Declined => Outcome::Declined {
            decline_code: "account_closed".to_owned(),
            message: "The bank account is closed.".to_owned(),
        },
        TestDestination::Pays | TestDestination::PaysSlowly => {
            Outcome::Succeeded(ProcessorPayout {
                id: format!("po_{}", Uuid::new_v4().simple()),
                destination: destination.as_str().to_owned(),
                money,
                status: ProcessorPayoutStatus::Succeeded,
            })
        }
    }
}
