//! A JSON request body, as raw bytes after its media type and size are checked: the handler
//! parses it, since it needs both the typed request and the body as sent.
//!
//! A body whose JSON holds a NUL character (`\u0000`) is refused here, before any key is
//! claimed: a record store's text cannot hold one (PostgreSQL's `text` refuses it), so an
//! operation that stores what the client sent would make its effect and then fail every finish
//! for ever.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::Problem;

/// A JSON body no larger than the router's body limit (axum's `DefaultBodyLimit`).
#[derive(Debug)]
pub struct JsonBody(pub Bytes);

/// Why a body was refused: 415 for another media type, 413 past the limit, 400 otherwise
/// (with axum's rejection, which says why: a client too slow for a timeout layer, say).
#[derive(Debug)]
pub enum BodyRejection {
    NotJson,
    TooLarge,
    /// A string of the JSON holds a NUL character, which no record store can hold as text.
    HoldsNul,
    Unreadable(BytesRejection),
}

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = BodyRejection;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(is_json_media_type);
        if !is_json {
            return Err(BodyRejection::NotJson);
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    BodyRejection::TooLarge
                } else {
                    BodyRejection::Unreadable(rejection)
                }
            })?;
        if holds_nul(&bytes) {
            return Err(BodyRejection::HoldsNul);
        }
        Ok(Self(bytes))
    }
}

/// Whether JSON text holds a NUL: a raw zero byte (never valid JSON), or the escape `\u0000`
/// itself; not an escaped backslash followed by `u0000` (`\\u0000` is the text `\u0000`).
fn holds_nul(json: &[u8]) -> bool {
    if json.contains(&0) {
        return true;
    }
    json.windows(6).enumerate().any(|(at, window)| {
        window == b"\\u0000" && {
            let backslashes = json[..at].iter().rev().take_while(|&&b| b == b'\\').count();
            backslashes % 2 == 0
        }
    })
}

/// `application/json`, with any parameters (`; charset=utf-8`), in any case.
fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

impl IntoResponse for BodyRejection {
    fn into_response(self) -> Response {
        match self {
            Self::NotJson => Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Send the body as application/json.",
            ),
            Self::TooLarge => Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "The request body is larger than this service accepts.",
            ),
            Self::HoldsNul => Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "The request body holds a NUL character (\\u0000), which this service cannot store.",
            ),
            Self::Unreadable(_) => Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "The request body could not be read.",
            ),
        }
        .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_type_allows_parameters_and_any_case() {
        assert!(is_json_media_type("application/json"));
        assert!(is_json_media_type("Application/JSON; charset=utf-8"));
        assert!(!is_json_media_type("text/plain"));
        assert!(!is_json_media_type("application/jsonx"));
        assert!(!is_json_media_type("application/x-www-form-urlencoded"));
    }

    #[test]
    fn a_nul_is_found_escaped_or_raw_but_not_an_escaped_backslash() {
        assert!(holds_nul(br#"{"email":"a\u0000b"}"#));
        assert!(holds_nul(br#"{"email":"\\\u0000"}"#));
        assert!(holds_nul(b"{\"email\":\"a\0b\"}"));
        assert!(!holds_nul(br#"{"email":"a\\u0000b"}"#));
        assert!(!holds_nul(br#"{"email":"a\u0001b"}"#));
        assert!(!holds_nul(br#"{"email":"u0000"}"#));
    }
}
