//! Turning a stored response back into HTTP.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use payments_idempotency::StoredResponse;

use crate::ApiError;

/// The header that tells a client it received a stored response, not a new execution.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Sends a stored response: the first answer and every replay are built from the same bytes, so
/// a replay is byte-identical by construction.
pub fn respond(stored: StoredResponse, replayed: bool) -> Response {
    let Ok(status) = StatusCode::from_u16(stored.status) else {
        return ApiError::Internal(format!("stored status {} is not valid", stored.status).into())
            .into_response();
    };
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) else {
            continue;
        };
        headers.insert(name, value);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}
