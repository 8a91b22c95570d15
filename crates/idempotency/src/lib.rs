//! The idempotency-key protocol and its exactly-once engine, independent of any web framework,
//! database or cache.
//!
//! It owns the rules a payment API must get exactly right: what a valid key is, what counts as
//! "the same request" (the [`Fingerprint`] over canonical JSON), the record's states and recovery
//! points, and the one pure [`decide`] function that says what a request carrying a key must do
//! given the record already stored under it. Records hold plain data (status code, allow-listed
//! headers, body bytes), so any framework can replay them. The [`engine`] drives an
//! [`engine::Operation`] through those rules, working only through the ports it defines (a
//! record store, a response cache, an observer), and its [`engine::Completer`] settles the
//! records whose attempt ended without an answer. A whole service on the engine is walked
//! through in `docs/build-a-service.md`, with `examples/orders`. This crate must not import
//! axum, sqlx, redis or any other crate of the workspace.

mod decision;
pub mod engine;
mod fingerprint;
mod key;
pub mod lifecycle;
mod policy;
mod record;
mod retry_after;

pub use decision::{Decision, decide};
pub use fingerprint::{
    AS_SENT, Comparison, Fingerprint, FingerprintError, Verbatim, canonical_json,
};
pub use key::{IdempotencyKey, KeyError};
pub use policy::{IdempotencyPolicy, PolicyError};
pub use record::{
    Attempt, IdempotencyRecord, PROBLEM_JSON, REPLAYED_HEADERS, RecordState, RecoveryPoint,
    SchemaVersion, Scope, StoredResponse, UnknownValue,
};
pub use retry_after::RecentDurations;
