//! The sending half of webhooks, apart from any store or web framework: the signature a delivery
//! carries ([`Secret`], [`signature_header`]), the guard on every connection to a tenant's URL
//! ([`guard`]), which keeps what the service sends out of its own network, one attempt and what
//! came of it ([`attempt`]), and when a failed delivery is tried again ([`RetrySchedule`]). Where a URL may
//! point is `payments_domain`'s [`AddressPolicy`](payments_domain::AddressPolicy); this crate
//! applies it to the addresses a name has when the service connects.

mod attempt;
pub mod guard;
mod schedule;
mod signature;

pub use attempt::{Attempt, Delivery, EXCERPT_BYTES, Outcome, attempt};
pub use schedule::RetrySchedule;
pub use signature::{Secret, SecretError, signature_header};
