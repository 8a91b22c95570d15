//! Black-box tests: each starts the real `card-sim` binary on a free port and talks to it
//! through [`HttpCardProcessor`](payments_card_sim::HttpCardProcessor) or raw HTTP. A few talk
//! to a fake processor instead, for answers `card-sim` never gives.

mod cancel;
mod captures;
mod charges;
mod helpers;
mod lookup;
mod payouts;
mod processing;
mod protocol;
mod refund_client;
mod refunds;
mod report;
mod server;
