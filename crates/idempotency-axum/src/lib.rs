//! The idempotency engine over HTTP, for an axum service: what a request carries (its
//! `Idempotency-Key`, how long it would wait for a duplicate in flight, its JSON body), and what
//! goes back (the stored answer, byte for byte, with the headers that say it is a replay and
//! until when its key holds; and the RFC 9457 problem documents of the protocol's refusals).
//!
//! A handler extracts [`IdempotencyKeyHeader`], [`PreferWait`] and [`JsonBody`], runs its
//! operation through the engine (`Engine::run`, with `KeyedRequest::of`, whose fingerprint
//! covers the method, the route and the canonical body) on an attempt that outlives its client
//! ([`Attempts::run`]), and answers with [`respond`] or, for a refusal, [`ProtocolProblem`]; at
//! shutdown the service waits for the attempts ([`Attempts::wait_for_all`]). This crate knows no
//! database, no operation and no crate of the workspace but the engine. A whole service on it
//! is walked through in `docs/build-a-service.md`, with `examples/orders`.

mod attempts;
mod body;
mod key;
mod problem;
mod replay;

pub use attempts::{AttemptStopped, Attempts};
pub use body::{BodyRejection, JsonBody};
pub use key::{IdempotencyKeyHeader, KeyRejection, PreferWait};
pub use problem::{PROBLEM_JSON, Problem, ProtocolProblem};
pub use replay::{
    IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENT_REPLAYED, IDEMPOTENT_SCHEMA_VERSION, http_date, respond,
};
