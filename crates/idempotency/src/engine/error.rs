//! Why the engine gives no answer of its own, and how a port says it failed. Each
//! [`ProtocolError`] is an error response, mapped by the service in one place.

use std::error::Error;

type Source = Box<dyn Error + Send + Sync>;

/// A record store call that failed.
#[derive(Debug, thiserror::Error)]
#[error("{}", match .kind {
    Kind::Unavailable => "the record store is unavailable",
    Kind::Busy => "a row the record store needed was held by another transaction",
    Kind::Refused => "the record store refused the write for good",
    Kind::BatchFailed | Kind::Other => "the record store failed",
})]
pub struct StoreFailure {
    kind: Kind,
    #[source]
    source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The store could not be reached or did not answer in time (a retry later may succeed),
    /// rather than refusing or failing the call.
    Unavailable,
    /// A row the call needed was held by another transaction for longer than the store waits
    /// for one: the store answered, nothing of the call was written, and a retry later may
    /// succeed.
    Busy,
    /// A commit the store shared among several records' transactions failed: nothing of this
    /// one was written, and it may be done again alone.
    BatchFailed,
    /// The store refused what the call wrote for a reason no retry changes: a row that breaks
    /// a constraint, a value its column cannot hold. The same write is refused every time.
    Refused,
    Other,
}

impl StoreFailure {
    /// The store could not be reached or did not answer in time.
    pub fn unavailable(source: impl Into<Source>) -> Self {
        Self::of(Kind::Unavailable, source)
    }

    /// A row the call needed was held by another transaction for longer than the store waits
    /// for one; nothing of the call was written.
    pub fn busy(source: impl Into<Source>) -> Self {
        Self::of(Kind::Busy, source)
    }

    /// A commit shared with other records' transactions failed, having written nothing of
    /// this one ([`Begin::alone`](super::Begin::alone)).
    pub fn batch_failed(source: impl Into<Source>) -> Self {
        Self::of(Kind::BatchFailed, source)
    }

    /// What the call wrote was refused for a reason no retry changes (a constraint it breaks,
    /// a value its column cannot hold). From an operation's `finish`, after its effect was
    /// made, it ends the record for good ([`Operation::unrecorded`](super::Operation::unrecorded)).
    pub fn refused(source: impl Into<Source>) -> Self {
        Self::of(Kind::Refused, source)
    }

    /// Any other failure.
    pub fn other(source: impl Into<Source>) -> Self {
        Self::of(Kind::Other, source)
    }

    fn of(kind: Kind, source: impl Into<Source>) -> Self {
        Self {
            kind,
            source: source.into(),
        }
    }

    pub fn is_batch_failed(&self) -> bool {
        self.kind == Kind::BatchFailed
    }

    pub fn is_unavailable(&self) -> bool {
        self.kind == Kind::Unavailable
    }

    pub fn is_busy(&self) -> bool {
        self.kind == Kind::Busy
    }

    pub fn is_refused(&self) -> bool {
        self.kind == Kind::Refused
    }

    /// The store's own error.
    pub fn into_source(self) -> Source {
        self.source
    }
}

/// A cache call that failed: always worked around.
pub type CacheFailure = Source;

/// An attempt that ends without a stored answer.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The key was first used with a different request (422).
    #[error("the idempotency key was used with a different request")]
    KeyReused,
    /// The key was first used with a request of another request version of the operation,
    /// which this one cannot be compared with (409).
    #[error("the idempotency key was used with a request of another request version")]
    KeyIncomparable,
    /// Another attempt holds the key (409).
    #[error("the idempotency key is in use; retry after {retry_after_secs} s")]
    KeyInUse { retry_after_secs: u64 },
    /// The outcome at the effect port is unknown, or its effect was not the one requested;
    /// nothing was stored, and a retry with the same key resumes the record (503).
    #[error("the effect port is unavailable")]
    EffectUnavailable,
    /// The records could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreFailure),
    /// A response could not be built.
    #[error("internal error: {0}")]
    Internal(#[source] Source),
}

/// `error` with its causes, for a log line: `a: b: c`.
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // Drivers often wrap an error and also display its source: say each thing once.
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
