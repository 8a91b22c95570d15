//! What the headers of an idempotent request carry: its `Idempotency-Key`, and how long the
//! client would wait for a duplicate in flight (`Prefer: wait=N`).

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use payments_idempotency::IdempotencyKey;

use crate::Problem;

/// The validated `Idempotency-Key` header: exactly one, visible ASCII, 1 to 255 characters.
#[derive(Debug, Clone)]
pub struct IdempotencyKeyHeader(pub IdempotencyKey);

/// Why a request's `Idempotency-Key` was refused (400). Nothing was claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRejection {
    /// `idempotency_key_missing`.
    Missing,
    /// `idempotency_key_invalid`: empty, too long, not visible ASCII, or sent twice.
    Invalid(String),
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKeyHeader {
    type Rejection = KeyRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let mut values = parts.headers.get_all("idempotency-key").iter();
        let value = values.next().ok_or(KeyRejection::Missing)?;
        // Two keys on one request cannot both be honoured; picking one would be a guess.
        if values.next().is_some() {
            return Err(KeyRejection::Invalid(
                "Send exactly one Idempotency-Key header.".into(),
            ));
        }
        let text = value.to_str().map_err(|_| {
            KeyRejection::Invalid(
                "the Idempotency-Key may contain only visible ASCII characters".into(),
            )
        })?;
        let key = IdempotencyKey::parse(text).map_err(|e| KeyRejection::Invalid(e.to_string()))?;
        Ok(Self(key))
    }
}

impl KeyRejection {
    pub fn problem(&self) -> Problem {
        match self {
            Self::Missing => Problem::new(
                StatusCode::BAD_REQUEST,
                "idempotency_key_missing",
                "The Idempotency-Key header is required for this request.",
            ),
            Self::Invalid(reason) => Problem::new(
                StatusCode::BAD_REQUEST,
                "idempotency_key_invalid",
                reason.clone(),
            ),
        }
    }
}

impl IntoResponse for KeyRejection {
    fn into_response(self) -> Response {
        self.problem().into_response()
    }
}

/// `Prefer: wait=N` (RFC 7240 §4.3): how long the client is willing to wait for a duplicate's
/// in-flight attempt instead of receiving 409 at once. Capped at [`PreferWait::MAX`]; other
/// preferences and malformed values are ignored, as RFC 7240 asks.
#[derive(Debug, Clone, Copy)]
pub struct PreferWait(pub Option<Duration>);

impl PreferWait {
    pub const MAX: Duration = Duration::from_secs(10);
}

impl<S: Send + Sync> FromRequestParts<S> for PreferWait {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let seconds = parts
            .headers
            .get_all("prefer")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .find_map(parse_wait);
        Ok(Self(seconds.map(|s| Duration::from_secs(s).min(Self::MAX))))
    }
}

/// The seconds of one `wait=N` preference, ignoring parameters after `;`.
fn parse_wait(preference: &str) -> Option<u64> {
    let token = preference.split(';').next()?.trim();
    let (name, value) = token.split_once('=')?;
    if !name.trim().eq_ignore_ascii_case("wait") {
        return None;
    }
    value.trim().trim_matches('"').parse().ok()
}

#[cfg(test)]
mod tests {
    use axum::http::Request;

    use super::*;

    async fn key_of(values: &[&str]) -> Result<String, KeyRejection> {
        let mut request = Request::builder();
        for value in values {
            request = request.header("idempotency-key", *value);
        }
        let (mut parts, ()) = request.body(()).unwrap_or_default().into_parts();
        let key = IdempotencyKeyHeader::from_request_parts(&mut parts, &()).await?;
        Ok(key.0.as_str().to_owned())
    }

    async fn wait_of(value: &str) -> Option<Duration> {
        let request = Request::builder().header("prefer", value);
        let (mut parts, ()) = request.body(()).unwrap_or_default().into_parts();
        let Ok(PreferWait(wait)) = PreferWait::from_request_parts(&mut parts, &()).await;
        wait
    }

    #[tokio::test]
    async fn a_key_is_exactly_one_valid_header() {
        assert_eq!(key_of(&["order-1"]).await, Ok("order-1".to_owned()));
        assert_eq!(key_of(&[]).await, Err(KeyRejection::Missing));
        assert!(matches!(
            key_of(&["a", "b"]).await,
            Err(KeyRejection::Invalid(_))
        ));
        assert!(matches!(key_of(&[""]).await, Err(KeyRejection::Invalid(_))));
        let long = "k".repeat(256);
        assert!(matches!(
            key_of(&[&long]).await,
            Err(KeyRejection::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn prefer_wait_is_read_capped_and_otherwise_ignored() {
        assert_eq!(wait_of("wait=3").await, Some(Duration::from_secs(3)));
        assert_eq!(
            wait_of("respond-async, wait=2").await,
            Some(Duration::from_secs(2))
        );
        assert_eq!(wait_of("wait=3600").await, Some(PreferWait::MAX));
        assert_eq!(wait_of("wait=soon").await, None);
        assert_eq!(wait_of("return=minimal").await, None);
    }

    #[test]
    fn a_wait_preference_is_found_among_other_preferences() {
        assert_eq!(parse_wait("wait=5"), Some(5));
        assert_eq!(parse_wait(" WAIT = 3 "), Some(3));
        assert_eq!(parse_wait("wait=\"7\""), Some(7));
        assert_eq!(parse_wait("respond-async"), None);
        assert_eq!(parse_wait("wait=soon"), None);
        assert_eq!(parse_wait("handling=lenient"), None);
    }
}
