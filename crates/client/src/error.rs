//! Why a call did not give the caller what it asked for, and what the caller does about it.

use crate::journal::JournalError;
use crate::types::Problem;

/// A call's failure. Each variant says whether the operation happened:
/// [`Problem`](Error::Problem) and [`RequestChanged`](Error::RequestChanged) are final;
/// [`OutcomeUnknown`](Error::OutcomeUnknown) is not, and names the key to resume it with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The service's final answer is an error: a decline, or a request it refused. A retry
    /// would get the same answer; `problem.code` says which (see the service's
    /// `docs/errors.md`).
    #[error("{} {}: {}", problem.status, problem.code, problem.detail)]
    Problem { problem: Box<Problem> },
    /// `422 idempotency_key_reused`: the key was first used with another request, whose answer
    /// it keeps. The request was changed under one key, a bug in the caller: a new request
    /// needs a new key.
    #[error(
        "the request was changed under one key: the key {key:?} was first used with another \
         request, whose answer it keeps; a new request needs a new key"
    )]
    RequestChanged { key: String, problem: Box<Problem> },
    /// No final answer came before the deadline: the operation may or may not have happened.
    /// Sending the same request under `key` (or resuming it from the journal) finishes or
    /// replays it, never doubles it.
    #[error(
        "no final answer after {attempts} attempt(s) before the deadline (last: {last}); the \
         outcome is unknown{}", resume_hint(key.as_deref())
    )]
    OutcomeUnknown {
        key: Option<String>,
        attempts: u32,
        last: String,
    },
    /// The service answered with a body this client cannot read.
    #[error("the service answered {status} with a body that is not {expected}: {excerpt}")]
    UnexpectedAnswer {
        status: u16,
        expected: &'static str,
        excerpt: String,
    },
    /// The journal holds another request under the operation's name: the caller asked for
    /// something else under a name it used before. Nothing was sent.
    #[error(
        "the journal holds another request under the name {name:?} ({recorded}); nothing was \
         sent: use another name (or another journal) for another request"
    )]
    JournalHoldsAnotherRequest { name: String, recorded: String },
    /// The caller gave a key, and the journal holds the operation under another one.
    #[error(
        "the journal holds the operation {name:?} under the key {recorded:?}, not {given:?}; \
         nothing was sent"
    )]
    JournalHoldsAnotherKey {
        name: String,
        recorded: String,
        given: String,
    },
    /// An operation named for a journal, on a client that has none.
    #[error("the operation {name:?} is named for a journal, and the client has none")]
    NoJournal { name: String },
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The base URL does not parse, or cannot take a path.
    #[error("base URL {url:?} is not an absolute http(s) URL")]
    InvalidBaseUrl { url: String },
    /// reqwest could not build its client.
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

fn resume_hint(key: Option<&str>) -> String {
    match key {
        Some(key) => format!(": send it again under the key {key:?}"),
        None => String::new(),
    }
}

impl Error {
    /// The problem the service answered, when it answered one.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Problem { problem } | Self::RequestChanged { problem, .. } => Some(problem),
            _ => None,
        }
    }
}
