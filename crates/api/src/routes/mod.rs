//! The router and its middleware.

#[cfg(feature = "bench")]
mod bench;
mod contract;
mod events;
mod health;
mod keys;
mod ledger;
mod ops;
pub(crate) mod problems;
mod request_id;

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, header};
use axum::routing::get;
use axum::{BoxError, Router};
use tower::ServiceBuilder;
use tower::timeout::TimeoutLayer;
use tower_http::map_request_body::MapRequestBodyLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::{ApiError, AppState, admission};

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Builds the whole application; `main` and the tests serve the same router.
pub fn app(state: AppState) -> Router {
    let body_limit = state.limits.body_limit_bytes;
    let body_timeout = state.limits.body_timeout;
    let header_limit = state.limits.header_limit_bytes;
    let request_timeout = state.limits.request_timeout;
    Router::new()
        .merge(crate::operations::routes())
        .route("/ledger/balances", get(ledger::balances))
        .route("/events", get(events::list))
        .route("/events/{id}", get(events::show))
        .route(
            "/ops/reconciliations",
            axum::routing::post(ops::run_reconciliation),
        )
        .route("/ops/exceptions", get(ops::list_exceptions))
        .route("/ops/exceptions/{id}", get(ops::show_exception))
        .route(
            "/ops/exceptions/{id}/resolve",
            axum::routing::post(ops::resolve_exception),
        )
        .route("/idempotency-keys/{key}", get(keys::show))
        .route("/openapi.yaml", get(contract::openapi))
        .route("/problems/{code}", get(problems::show))
        .route("/healthz", get(health::live))
        .route("/readyz", get(health::ready))
        .merge(bench_routes())
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
                // A client's request id is kept only if it is a UUID, so whatever it sends
                // cannot reach a log line as written; otherwise the next layer makes one.
                .layer(axum::middleware::from_fn(request_id::vet))
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(TraceLayer::new_for_http().make_span_with(request_id::span))
                .layer(PropagateRequestIdLayer::new(REQUEST_ID))
                // One in-flight limit for the whole instance, and a share of it per tenant:
                // a request beyond either is refused at once (503 or 429, with Retry-After)
                // rather than queued until its client times out and retries. The layer is
                // applied to every route, and every copy counts on the same slots.
                .layer(axum::middleware::from_fn_with_state(
                    admission::Admission::new(state.api_keys.clone(), &state.limits),
                    admission::limit_in_flight,
                ))
                // A request over the whole-request timeout is cut off (503 `timeout`); a
                // charge stopped mid-way is settled by a retry or the completer.
                .layer(HandleErrorLayer::new(|_: BoxError| async move {
                    ApiError::Timeout
                }))
                .layer(TimeoutLayer::new(request_timeout))
                .layer(axum::middleware::from_fn(move |request, next| {
                    limit_header_size(request, next, header_limit)
                }))
                // A client that stalls while sending its body is cut off (408); the body is
                // read before the key is claimed, so a slow client never holds a lock.
                .layer(RequestBodyTimeoutLayer::new(body_timeout))
                .layer(MapRequestBodyLayer::new(Body::new)),
        )
        .with_state(state)
}

/// The metrics listener's router: `/metrics` only, apart from the API, because the metrics
/// show every tenant's counts (`server.metrics_bind`).
pub(crate) fn metrics_app(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .with_state(state)
}

#[cfg(feature = "bench")]
fn bench_routes() -> Router<AppState> {
    use axum::routing::post;
    Router::new()
        .route("/bench/redis", get(bench::redis))
        .route("/bench/read", get(bench::read))
        .route("/bench/charge", post(bench::charge))
        .route("/bench/charge-2", post(bench::charge_in_two_commits))
        .route("/bench/reap", post(bench::reap))
}

#[cfg(not(feature = "bench"))]
fn bench_routes() -> Router<AppState> {
    Router::new()
}

/// Refuses requests whose header names and values add up to more than `limit` bytes.
async fn limit_header_size(
    request: axum::extract::Request,
    next: axum::middleware::Next,
    limit: usize,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if size > limit {
        return ApiError::HeadersTooLarge { limit }.into_response();
    }
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError::NotFound("No such resource.".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
