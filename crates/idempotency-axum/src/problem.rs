//! RFC 9457 problem documents: a status, a stable snake_case `code` a client can branch on,
//! and a detail a person can read. The protocol's own refusals are [`ProtocolProblem`].

use std::borrow::Cow;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use payments_idempotency::engine::{ProtocolError, error_chain};
use serde::Serialize;

/// The media type of every problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem document, and the `Retry-After` its answer carries, if any.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// A URI reference to the documentation of the problem's type: `about:blank` (the status
    /// says it all) unless the service documents its codes ([`Problem::with_type`]).
    #[serde(rename = "type")]
    pub kind: Cow<'static, str>,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    pub code: &'static str,
    /// The members a problem type adds after the standard ones (RFC 9457 §3.2), such as a
    /// decline's own code.
    #[serde(flatten)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
    #[serde(skip)]
    pub retry_after_secs: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            kind: Cow::Borrowed("about:blank"),
            title: reason_phrase(status),
            status: status.as_u16(),
            detail: detail.into(),
            code,
            extensions: serde_json::Map::new(),
            retry_after_secs: None,
        }
    }

    /// With `uri`, a URI reference to the documentation of this problem's type, as its `type`.
    pub fn with_type(mut self, uri: impl Into<Cow<'static, str>>) -> Self {
        self.kind = uri.into();
        self
    }

    /// With the extension member `name`.
    pub fn with(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// The document as JSON.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        // Serialising plain strings, numbers and JSON values cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// With `Retry-After: secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }
}

/// The reason phrase RFC 9110 gives `status`: where it renamed one (413 and 422), its own, not
/// the older one that HTTP libraries still carry.
fn reason_phrase(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "Content Too Large",
        StatusCode::UNPROCESSABLE_ENTITY => "Unprocessable Content",
        _ => status.canonical_reason().unwrap_or("Error"),
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, self.to_json_bytes()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The answer to a request the engine refused or could not finish: 422 for a key reused with
/// another request, 409 with `Retry-After` while another attempt holds the key, 409 for a
/// request of an incomparable request version, 503 with `Retry-After` when the outcome is
/// unknown, the store unavailable or a row it needed held by another transaction (the key is
/// kept: a retry resumes it), 500 otherwise. The
/// cause of a 5xx is logged here, once, and never sent.
#[derive(Debug)]
pub struct ProtocolProblem(pub ProtocolError);

impl From<ProtocolError> for ProtocolProblem {
    fn from(error: ProtocolError) -> Self {
        Self(error)
    }
}

impl ProtocolProblem {
    pub fn problem(&self) -> Problem {
        match &self.0 {
            ProtocolError::KeyReused => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "This Idempotency-Key was already used with a different request. Use a new key \
                 for a new request.",
            ),
            ProtocolError::KeyIncomparable => Problem::new(
                StatusCode::CONFLICT,
                "idempotency_key_incomparable",
                "This Idempotency-Key was used with a request of another version of this \
                 operation, which cannot be compared with this one; nothing was executed.",
            ),
            ProtocolError::KeyInUse { retry_after_secs } => Problem::new(
                StatusCode::CONFLICT,
                "idempotency_key_in_use",
                "A request with this Idempotency-Key is still being processed. Retry after the \
                 indicated delay, or send `Prefer: wait=N` to wait for its answer.",
            )
            .retry_after(*retry_after_secs),
            ProtocolError::EffectUnavailable => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "effect_unavailable",
                "The outcome is not known yet. Retry with the same Idempotency-Key.",
            )
            .retry_after(1),
            ProtocolError::Store(failure) if failure.is_unavailable() => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "The service is unavailable. Retry with the same Idempotency-Key.",
            )
            .retry_after(1),
            ProtocolError::Store(failure) if failure.is_busy() => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_busy",
                "A record this request needs is held by another transaction. Retry with the same \
                 Idempotency-Key.",
            )
            .retry_after(1),
            ProtocolError::Store(_) | ProtocolError::Internal(_) => Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "Internal error.",
            ),
        }
    }
}

impl IntoResponse for ProtocolProblem {
    fn into_response(self) -> Response {
        let problem = self.problem();
        if problem.status >= 500 {
            tracing::error!(error = %error_chain(&self.0), code = problem.code, "request failed");
        }
        problem.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row held past the store's lock timeout is transient, like an unavailable store: 503
    /// with `Retry-After`, never a 500.
    #[test]
    fn a_held_row_is_a_503_to_retry_not_an_internal_error() {
        use payments_idempotency::engine::StoreFailure;
        let problem = ProtocolProblem(ProtocolError::Store(StoreFailure::busy("held"))).problem();
        assert_eq!(
            (problem.status, problem.code, problem.retry_after_secs),
            (503, "store_busy", Some(1))
        );
    }

    #[test]
    fn titles_are_rfc_9110s_reason_phrases() {
        let title = |status| Problem::new(status, "code", "detail").title;
        assert_eq!(
            title(StatusCode::UNPROCESSABLE_ENTITY),
            "Unprocessable Content"
        );
        assert_eq!(title(StatusCode::PAYLOAD_TOO_LARGE), "Content Too Large");
        assert_eq!(title(StatusCode::CONFLICT), "Conflict");
        assert_eq!(title(StatusCode::PAYMENT_REQUIRED), "Payment Required");
    }
}
