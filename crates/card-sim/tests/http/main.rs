//! Black-box tests: each starts the real `card-sim` binary on a free port and talks to it
//! through [`HttpCardProcessor`](payments_card_sim::HttpCardProcessor) or raw HTTP.

mod charges;
mod helpers;
mod lookup;
mod protocol;
mod server;
