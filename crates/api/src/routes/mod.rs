//! The router and its middleware.

mod charges;
mod health;
mod ledger;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request, header};
use axum::routing::get;
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;

use crate::{ApiError, AppState};

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Builds the whole application; `main` and the tests serve the same router.
pub fn app(state: AppState) -> Router {
    let body_limit = state.limits.body_limit_bytes;
    Router::new()
        .route("/charges", get(charges::list).post(charges::create))
        .route("/charges/{id}", get(charges::show))
        .route("/ledger/balances", get(ledger::balances))
        .route("/healthz", get(health::live))
        .route("/readyz", get(health::ready))
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn(crate::metrics::track_requests))
        // Outermost first: hide credentials from everything below, give the request an id,
        // trace it inside a span that carries the id, and echo the id on the response.
        .layer(
            ServiceBuilder::new()
                .layer(SetSensitiveRequestHeadersLayer::new([
                    header::AUTHORIZATION,
                ]))
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(
                    TraceLayer::new_for_http().make_span_with(|request: &Request<_>| {
                        let request_id = request
                            .headers()
                            .get(REQUEST_ID)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default();
                        tracing::info_span!(
                            "request",
                            http.method = %request.method(),
                            http.path = %request.uri().path(),
                            request.id = %request_id,
                        )
                    }),
                )
                .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
        )
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("No such resource.".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
