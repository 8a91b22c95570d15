//! A simulated card processor with its own idempotency, behind the domain's
//! [`CardProcessor`](payments_domain::CardProcessor) port.
//!
//! Like a real processor, it remembers every idempotency key it has seen and answers a repeated
//! key with the charge it already made, so that a retry of the service can never charge twice.
//! The test tokens choose the outcome (see [`TestToken`]). This crate depends only on the domain.

mod simulator;
mod tokens;

pub use simulator::InMemoryCardProcessor;
pub use tokens::TestToken;
