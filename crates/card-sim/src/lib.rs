//! A simulated card processor with its own idempotency, behind the domain's
//! [`CardProcessor`](payments_domain::CardProcessor) port, in three forms:
//!
//! - [`InMemoryCardProcessor`]: the simulator itself, inside the caller's process;
//! - the `card-sim` binary ([`server`]): the same simulator as an HTTP server in its own
//!   process (`--bind` or `CARD_SIM_BIND`, `CARD_SIM_LATENCY_MS`, `CARD_SIM_KEY_WINDOW_SECS`),
//!   so a processor outlives crashes of the service and a slow one can be simulated;
//! - [`HttpCardProcessor`] ([`client`]): the port over HTTP, for talking to that server.
//!
//! Like a real processor, it remembers every idempotency key it has seen within its key window
//! and answers a repeated key with the charge it already made, so that a retry of the service
//! can never charge twice; once the window has passed, it forgets the key and what was made
//! under it, so its memory is bounded by the traffic within the window.
//! Like a slow one, it makes a charge exist only once its latency has passed, and until then
//! says only that the key is processing; a cancel under a key without a charge tombstones it,
//! which is the one answer that no charge will ever exist under that key. An authorisation (a
//! charge made with `"capture": false`) shares the charges' keys and token rules, and holds its
//! amount until one capture (all of it or less) or one void, each under keys of its own, takes
//! or releases it: of a capture and a void racing, or of two captures, exactly one succeeds.
//! Refunds, under keys of their own, keep exactly the same protocol, and never give back more
//! than their charge took (an authorisation, what its capture took), however many race; so do
//! captures and voids, and payouts ([`PayoutProcessor`](payments_domain::PayoutProcessor)),
//! whose test bank accounts choose their outcome (see [`TestDestination`]).
//! It keeps the metadata each caller sends with what it makes, and lists what it made each
//! day in a settlement report ([`SettlementReport`](payments_domain::SettlementReport)),
//! which tests can make differ from its books (a line dropped or altered, a charge no one
//! asked for) so that reconciliation has something to find.
//! The test tokens choose the outcome (see [`TestToken`]); the token rules live only in the
//! simulator, which the server wraps. This crate depends only on the domain among the
//! workspace's crates; it must not import the service's storage or API.

pub mod client;
mod report;
pub mod server;
mod simulator;
mod tokens;
mod wire;

pub use client::{ClientError, HttpCardProcessor};
pub use simulator::{InMemoryCardProcessor, UnknownProcessorId};
pub use tokens::{TestDestination, TestToken};
