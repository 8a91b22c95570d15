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

use std::sync::Arc;

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
use tracing::Instrument;

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use payments_idempotency::Verbatim;
use payments_idempotency::engine::{Idempotent, KeyedRequest, Operation};
use payments_storage::{StoreError, Transaction};

use crate::admission;
use crate::extract::KeyedCall;
use crate::replay::respond;
use crate::{ApiError, AppState};

/// Runs the request of `op` that `validate` makes of the call's `body` through the engine under
/// the call's key, and answers with what it gives. `validate` gives the typed request and the
/// body as the client sent it, parsed (records from before request versions were
/// fingerprinted over it); the fingerprint covers the operation's canonical form of the
/// request (with its route), which is stored with the record for the completer.
///
/// A retry sent byte for byte as a request this instance answered or replayed lately (its
/// target and body) is replayed before `validate` runs: it was validated and judged the first
/// time. A replay from this instance's recent answers is served here too; anything else runs on a task of
/// its own, which holds the request's in-flight slots until it ends, and which the service waits
/// for when it stops. A client that goes away (its own timeout, a closed connection, a reset
/// HTTP/2 stream) and the request timeout end only the wait for the answer, never the attempt:
/// stopped halfway, an attempt would leave a charge the processor made unrecorded and its key
/// locked, until a retry took the lock over or the completer settled it.
pub(crate) async fn run_idempotent<O, Validated>(
    state: &AppState,
    op: &Arc<Idempotent<O>>,
    call: impl Into<KeyedCall>,
    body: &[u8],
    validate: impl FnOnce() -> Validated,
) -> Result<axum::response::Response, ApiError>
where
    O: Operation<Transaction = Transaction>,
    Validated: Future<Output = Result<(O::Request, serde_json::Value), ApiError>>,
{
    let KeyedCall {
        owner,
        key,
        target,
        wait,
        admitted,
    } = call.into();
    let verbatim = Verbatim::of(&[target.as_str().as_bytes(), body]);
    if let Some(answer) = state
        .engine
        .replay_verbatim(op, &owner, &key, &verbatim)
        .await
    {
        return Ok(respond(answer?));
    }
    let (request, as_sent) = validate().await?;
    let request = KeyedRequest::of::<O>(owner, key, request, &as_sent, wait).sent_as(verbatim);
    // A replay from the caches writes no record: it needs no task of its own.
    if let Some(answer) = state.engine.replay_cached(op, &request).await {
        return Ok(respond(answer?));
    }
    let (engine, op) = (Arc::clone(&state.engine), Arc::clone(op));
    let attempt = async move {
        let answer = engine.run_past_caches(&op, request).await;
        drop(admitted);
        answer
    };
    // In the request's span, so that its log lines still carry the request id.
    let attempt = state
        .attempts
        .spawn(attempt.instrument(tracing::Span::current()));
    match attempt.await {
        Ok(answer) => Ok(respond(answer?)),
        Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
        // The runtime is going away: the attempt stopped where a crash would have.
        Err(ended) => Err(ApiError::Internal(ended.into())),
    }
}

/// The tenant's object the path names (`find` looks it up by its id), or 404: for another
/// tenant's object, an unknown one, and a segment that is not an id of its kind or does not
/// even decode (invalid UTF-8) alike.
pub(crate) async fn tenants<Id, T, Found>(
    id: Result<Path<String>, PathRejection>,
    object: &str,
    find: impl FnOnce(Id) -> Found,
) -> Result<T, ApiError>
where
    Id: std::str::FromStr,
    Found: Future<Output = Result<Option<T>, StoreError>>,
{
    let Path(id) = id.map_err(|_| ApiError::NotFound(format!("No such {object}.")))?;
    let not_found = || ApiError::NotFound(format!("No such {object}: {id}"));
    let id: Id = id.parse().map_err(|_| not_found())?;
    find(id).await?.ok_or_else(not_found)
}

/// The query of a list (`GET /charges`, `GET /events` with its type, and every other list): a
/// page size and a keyset cursor.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListParams {
    limit: Option<u32>,
    starting_after: Option<String>,
}

impl ListParams {
    const DEFAULT_LIMIT: u32 = 10;
    const MAX_LIMIT: u32 = 100;

    /// The page of `object`s that `read` finds for the checked limit and cursor; a cursor that
    /// `read` does not find among them is a 400.
    pub(crate) async fn page<Id, Page, Read>(
        &self,
        object: &str,
        read: impl FnOnce(u32, Option<Id>) -> Read,
    ) -> Result<Page, ApiError>
    where
        Id: std::str::FromStr,
        Read: Future<Output = Result<Option<Page>, StoreError>>,
    {
        let page = read(self.limit()?, self.starting_after(object)?).await?;
        page.ok_or_else(|| self.unknown_cursor(object))
    }

    fn limit(&self) -> Result<u32, ApiError> {
        let limit = self.limit.unwrap_or(Self::DEFAULT_LIMIT);
        if !(1..=Self::MAX_LIMIT).contains(&limit) {
            return Err(ApiError::InvalidRequest(format!(
                "limit: must be between 1 and {}, got {limit}",
                Self::MAX_LIMIT
            )));
        }
        Ok(limit)
    }

    /// The cursor, an id of the listed `object`s.
    fn starting_after<Id: std::str::FromStr>(&self, object: &str) -> Result<Option<Id>, ApiError> {
        self.starting_after
            .as_deref()
            .map(|id| id.parse().map_err(|_| self.unknown_cursor(object)))
            .transpose()
    }

    /// 400 for a cursor that is not one of the listed objects.
    fn unknown_cursor(&self, object: &str) -> ApiError {
        let id = self.starting_after.as_deref().unwrap_or_default();
        ApiError::InvalidRequest(format!("starting_after: no such {object}: {id}"))
    }
}

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
