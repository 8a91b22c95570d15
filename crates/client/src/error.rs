//! Why a call did not give the caller what it asked for, and what the caller does about it.

use std::time::SystemTime;

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
    /// replays it, never doubles it, as long as the service still holds the key: a resend
    /// started before `resend_before` (with the same deadline) ends while it surely does. After
    /// that, or when `resend_before` is `None`, the service is asked about the key first
    /// (`GET /idempotency-keys/{key}`), as the journal does.
    #[error(
        "no final answer after {attempts} attempt(s) before the deadline (last: {last}); the \
         outcome is unknown{}", resume_hint(key.as_deref(), *resend_before)
    )]
    OutcomeUnknown {
        key: Option<String>,
        attempts: u32,
        last: String,
        resend_before: Option<SystemTime>,
    },
    /// The journal holds the operation without an answer, and the service no longer holds its
    /// key (its retention ended, or the first request never reached it), or holds it too
    /// briefly to send the request again: a new send could make the operation a second time.
    /// Nothing was sent; whether the operation happened is for the caller to check, in the
    /// list `list` names.
    #[error(
        "the journal holds the operation {name:?} without an answer, under the key {key:?} \
         first sent {}; the service no longer holds that key (its retention is over, or the \
         request never reached it), or not for long enough to send it again, and a new send \
         could make it a second time, so nothing was sent: check whether it was made ({list}) \
         and, only if it was not, make it as a new operation (another key, or another journal)",
        first_sent.map_or_else(|| "at a time not recorded".to_owned(), |at| format!("on {}", httpdate::fmt_http_date(at)))
    )]
    KeyGone {
        name: String,
        key: String,
        first_sent: Option<SystemTime>,
        /// The request that shows what was made, such as `GET /charges` (or, for a capture or
        /// a cancel, `GET /charges/{id}`).
        list: String,
    },
    /// An answer that does not answer the request (another amount, currency or charge than
    /// was sent): something between the caller and the service answered for it. It is not
    /// recorded; the operation's outcome under `key` is unknown.
    #[error(
        "an answer names {field} {answered}, and {sent} was sent: it answers another request, \
         and was not taken nor recorded; the outcome under the key {key:?} is unknown (ask the \
         service: GET /idempotency-keys/{key})"
    )]
    AnswerMismatch {
        key: String,
        field: &'static str,
        sent: serde_json::Value,
        answered: serde_json::Value,
    },
    /// A redirection: the client follows none, since a request sent elsewhere would carry its
    /// body and key to another service. The base URL is wrong.
    #[error(
        "the service answered {status}, a redirection to {location}: redirections are not \
         followed; use the service's own address as the base URL"
    )]
    Redirected { status: u16, location: String },
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
    /// The journal's entry was recorded against another service (another base URL). Nothing
    /// was sent.
    #[error(
        "the journal holds the operation {name:?} as sent to {recorded}, not {given}; nothing \
         was sent: use the journal with the service it was recorded against, or another journal"
    )]
    JournalOfAnotherService {
        name: String,
        recorded: String,
        given: String,
    },
    /// The journal's entry was recorded by another tenant (another API key). Nothing was sent.
    #[error(
        "the journal holds the operation {name:?} as sent with another API key (another \
         tenant's); nothing was sent: use the journal with the API key it was recorded with, \
         or another journal"
    )]
    JournalOfAnotherTenant { name: String },
    /// An operation named for a journal, on a client that has none.
    #[error("the operation {name:?} is named for a journal, and the client has none")]
    NoJournal { name: String },
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The base URL does not parse, cannot take a path, or carries user-info (the API key is
    /// the only credential). `url` is as given, without its user-info.
    #[error("base URL {url:?} {reason}")]
    InvalidBaseUrl { url: String, reason: &'static str },
    /// reqwest could not build its client.
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

fn resume_hint(key: Option<&str>, resend_before: Option<SystemTime>) -> String {
    match (key, resend_before) {
        (None, _) => String::new(),
        (Some(key), Some(before)) => format!(
            ": send it again under the key {key:?} before {} to resume it (after that, ask the \
             service about the key first: GET /idempotency-keys/{key})",
            httpdate::fmt_http_date(before)
        ),
        (Some(key), None) => format!(
            ": the service may no longer hold the key {key:?}, so ask it about the key \
             (GET /idempotency-keys/{key}) before sending it again"
        ),
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
