//! `GET /openapi.yaml`: the contract this build answers by, the very file the contract test
//! checks the service against, embedded when the service is built.

use axum::http::header;
use axum::response::IntoResponse;

/// `openapi.yaml`, at the root of the repository.
const CONTRACT: &str = include_str!("../../../../openapi.yaml");

/// The contract, as YAML (RFC 9512's media type).
pub(super) async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/yaml")], CONTRACT)
}
