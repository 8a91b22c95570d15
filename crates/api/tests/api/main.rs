//! Black-box tests: the real `payments-api` binary, started on a random port against its own
//! fresh PostgreSQL database, driven over HTTP.

mod card_sim;
mod charges;
mod concurrency;
// Crash injection needs the service built with `--features failpoints`.
#[cfg(feature = "failpoints")]
mod crash;
mod events;
mod helpers;
mod hostile;
mod keys;
mod reads;
mod recovery;
mod redis_server;
mod startup;
mod validation;
