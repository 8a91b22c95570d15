//! Why the protocol gives no answer of its own: each of these is an HTTP error, mapped by the
//! API in one place (`ApiError`'s `From<ProtocolError>`).

use payments_storage::StoreError;

/// An attempt that ends without a stored answer.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The key was first used with a different request (422).
    #[error("the idempotency key was used with a different request")]
    KeyReused,
    /// Another attempt holds the key (409).
    #[error("the idempotency key is in use; retry after {retry_after_secs} s")]
    KeyInUse { retry_after_secs: u64 },
    /// The outcome at the processor is unknown, or its effect was not the one requested;
    /// nothing was stored, and a retry with the same key resumes the record (503).
    #[error("the processor is unavailable")]
    ProcessorUnavailable,
    /// The records could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A response could not be built.
    #[error("internal error: {0}")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}
