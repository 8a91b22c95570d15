//! Black-box tests: the real `payments-api` binary, started on a random port against its own
//! fresh PostgreSQL database, driven over HTTP.

mod charges;
mod concurrency;
mod helpers;
mod reads;
mod startup;
mod validation;
