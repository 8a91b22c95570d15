//! Redis for the payments service, only ever an accelerator and a transport: nothing here is a
//! source of truth, and every failure is an ordinary error the caller works around.
//!
//! - [`RedisLink`] (`link.rs`): one connection (to a server, or to the master Sentinel names),
//!   made on first use, re-made after a failure, never holding a request up past its timeout;
//! - [`ReplayCache`] (`replay_cache.rs`): completed responses for the engine's
//!   `ResponseCache`, each entry under an HMAC that Redis never sees the secret of;
//! - [`EventStream`] (`event_stream.rs`): the stream the outbox relay publishes to, the
//!   storage crate's `EventSink`.

mod event_stream;
mod link;
mod replay_cache;

pub use event_stream::EventStream;
pub use link::{RedisFailure, RedisLink, SentinelPasswords};
pub use replay_cache::{CacheSecret, CacheSecretTooShort, Rejection, ReplayCache};
