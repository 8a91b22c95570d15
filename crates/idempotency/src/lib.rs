//! The idempotency-key protocol, independent of any web framework or database.
//!
//! It owns the rules a payment API must get exactly right: what a valid key is, what counts as
//! "the same request" (the [`Fingerprint`] over canonical JSON), the record's states and recovery
//! points, and the one pure [`decide`] function that says what a request carrying a key must do
//! given the record already stored under it. Records hold plain data (status code, allow-listed
//! headers, body bytes), so any framework can replay them. This crate must not import axum, sqlx,
//! redis or any other crate of the workspace.

mod decision;
mod fingerprint;
mod key;
mod policy;
mod record;
mod retry_after;

pub use decision::{Decision, decide};
pub use fingerprint::{Fingerprint, FingerprintError, canonical_json};
pub use key::{IdempotencyKey, KeyError};
pub use policy::{IdempotencyPolicy, PolicyError};
pub use record::{
    Attempt, IdempotencyRecord, REPLAYED_HEADERS, RecordState, RecoveryPoint, Scope,
    StoredResponse, UnknownValue,
};
pub use retry_after::RecentDurations;

/// The operation name of `POST /charges`, carrying its response schema version: a stored
/// response is only ever replayed in the shape it was recorded in.
pub const CHARGES_CREATE_V1: &str = "charges.create.v1";

/// The operation of `POST /charges/{id}/refunds`, with its response schema version.
pub const REFUNDS_CREATE_V1: &str = "refunds.create.v1";
