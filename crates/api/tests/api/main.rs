//! Black-box tests: the real `payments-api` binary, started on a random port against its own
//! fresh PostgreSQL database, driven over HTTP.

// The bench-only floors exist only with `--features bench`.
#[cfg(feature = "bench")]
mod bench_endpoints;
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
