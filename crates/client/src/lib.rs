//! The caller's half of the exactly-once protocol: a typed client of the payments API that
//! retries correctly, so that a caller gets each charge, capture or cancel of a hold, refund and
//! payout exactly once however its network fails.
//!
//! - One `Idempotency-Key` per logical operation ([`Operation`]), made before the first send
//!   and sent by every attempt.
//! - An optional [`Journal`] that records the operation and its key before the first send and
//!   its answer at the end, so that a caller that crashes and starts again resumes under the
//!   same key ([`FileJournal`] keeps it in a file, private to its user). An entry belongs to
//!   the service and the tenant that recorded it.
//! - A key is sent only while the service surely holds it (the [`retention`] module): past its
//!   retention the service is asked about the key first, and a key it no longer holds is
//!   never sent again ([`Error::KeyGone`]).
//! - No redirection is followed, and an answer that names another amount, currency or charge
//!   than was sent is no answer ([`Error::AnswerMismatch`]).
//! - One retry policy ([`RetryPolicy`], the `retry` module): connection failures, timeouts,
//!   `409 idempotency_key_in_use`, `408`, `429` and `5xx` are retried under the same key, after
//!   `Retry-After` when the answer gives one and with capped exponential backoff and full
//!   jitter otherwise, until an overall deadline; every other answer is final. A `422
//!   idempotency_key_reused` is [`Error::RequestChanged`]: the request was changed under one
//!   key.
//!
//! - The consumer's half of webhooks ([`webhooks`]): a delivery's Standard Webhooks signatures
//!   verified against the endpoint's secret, within a timestamp tolerance.
//!
//! The types follow the service's `openapi.yaml` field for field; `tests/contract.rs` checks
//! them against it. This crate knows nothing of the service's own crates: it speaks HTTP.

mod client;
mod echo;
mod error;
mod journal;
mod operation;
mod received;
pub mod retention;
pub mod retry;
pub mod types;
pub mod webhooks;
mod write;

pub use client::Client;
pub use error::Error;
pub use journal::{
    FileJournal, Journal, JournalEntry, JournalError, RecordedAnswer, api_key_fingerprint,
};
pub use operation::{Answer, Operation, Origin};
pub use retry::RetryPolicy;
