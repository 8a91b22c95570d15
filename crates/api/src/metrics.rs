//! Prometheus metrics: what matters about requests, idempotency outcomes, the processor, the
//! outbox and Redis. Rendered at `GET /metrics`.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Latency buckets in seconds: from sub-millisecond replays to slow processor calls.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Installs the process-wide recorder; `None` if one is installed already.
pub fn install() -> Option<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .ok()?
        .install_recorder()
        .ok()
}

/// What the protocol did with a request or an abandoned record: the `outcome` label of
/// `idempotency_outcomes_total`, and the `idempotency.outcome` log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The attempt ran the operation and stored its answer.
    Executed,
    /// A replay served from the Redis cache.
    ReplayedCache,
    /// A replay served from the database.
    ReplayedDb,
    /// A duplicate of an attempt in flight (409, or a wait that ran out).
    InFlight,
    /// Another payload under a used key (422).
    Mismatch,
    /// The attempt took over an abandoned record.
    TakenOver,
    /// The attempt lost its record to another and answered from it.
    Fenced,
    /// The completer finished a record whose effect the processor had made.
    CompletedByCompleter,
    /// The completer failed a record after the processor tombstoned its key.
    FailedByCompleter,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::ReplayedCache => "replayed_cache",
            Self::ReplayedDb => "replayed_db",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::TakenOver => "taken_over",
            Self::Fenced => "fenced",
            Self::CompletedByCompleter => "completed_by_completer",
            Self::FailedByCompleter => "failed_by_completer",
        }
    }
}

/// Counts an idempotency outcome, and logs it, so each request's log carries its outcome
/// (inside the request span).
pub fn outcome(outcome: Outcome) {
    let name = outcome.as_str();
    counter!("idempotency_outcomes_total", "outcome" => name).increment(1);
    tracing::info!(idempotency.outcome = name, "idempotency outcome");
}

/// A call to the processor: the `operation` label of `processor_call_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessorCall {
    Charge,
    Refund,
}

impl ProcessorCall {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
        }
    }
}

/// A Redis call that failed (and was worked around).
pub fn redis_error(call: RedisCall) {
    counter!("redis_errors_total", "operation" => call.as_str()).increment(1);
}

/// A Redis call that can fail and be worked around: the `operation` label of
/// `redis_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisCall {
    /// Reading the replay cache (the database answers instead).
    CacheGet,
    /// Writing the replay cache (the next replay reads the database).
    CachePut,
    /// Deleting a replaced generation's cached response (it expires with its record anyway).
    CacheForget,
    /// Publishing outbox events to the stream (the relay tries again).
    Xadd,
}

impl RedisCall {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CacheGet => "cache_get",
            Self::CachePut => "cache_put",
            Self::CacheForget => "cache_forget",
            Self::Xadd => "xadd",
        }
    }
}

/// The processor reported a charge that is not the one requested (another amount or
/// currency, or a status other than succeeded): it was not recorded.
pub fn processor_mismatch() {
    counter!("processor_mismatch_total").increment(1);
}

/// A replay-cache entry failed its MAC check or did not parse: it was not served.
pub fn replay_cache_rejected() {
    counter!("replay_cache_rejected_total").increment(1);
}

pub fn processor_call(call: ProcessorCall, started: Instant) {
    histogram!("processor_call_duration_seconds", "operation" => call.as_str())
        .record(started.elapsed().as_secs_f64());
}

pub fn outbox_backlog(unpublished: i64, oldest_age_secs: f64) {
    gauge!("outbox_backlog").set(unpublished as f64);
    gauge!("outbox_relay_lag_seconds").set(oldest_age_secs);
}

/// A request took an in-flight slot (`http_requests_in_flight`).
pub fn request_admitted() {
    gauge!("http_requests_in_flight").increment(1.0);
}

/// A request gave its in-flight slot back.
pub fn request_finished() {
    gauge!("http_requests_in_flight").decrement(1.0);
}

pub fn events_published(count: usize) {
    counter!("outbox_events_published_total").increment(count as u64);
}

/// The `method` label: the standard methods by name, every other method as `other`. The
/// method is chosen by the client, so taking it verbatim would let anyone, without even
/// authenticating, add a series per request until the exporter runs out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodLabel {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
    Options,
    Other,
}

impl MethodLabel {
    pub fn of(method: &Method) -> Self {
        match *method {
            Method::GET => Self::Get,
            Method::HEAD => Self::Head,
            Method::POST => Self::Post,
            Method::PUT => Self::Put,
            Method::PATCH => Self::Patch,
            Method::DELETE => Self::Delete,
            Method::OPTIONS => Self::Options,
            _ => Self::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
            Self::Options => "OPTIONS",
            Self::Other => "other",
        }
    }
}

/// Counts every request by route template, method and status, and times it.
///
/// Every label comes from a fixed set, never from the request as sent: the route is the
/// matched template (`/charges/{id}`, not the id) or `unmatched`, the method a
/// [`MethodLabel`], the status one the service chose.
pub async fn track_requests(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let method = MethodLabel::of(request.method()).as_str();
    let started = Instant::now();
    let response = next.run(request).await;
    histogram!("http_request_duration_seconds", "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    let status = response.status().as_u16().to_string();
    counter!("http_requests_total", "route" => route, "method" => method, "status" => status)
        .increment(1);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_methods_keep_their_name_and_any_other_is_other() {
        for (method, label) in [
            (Method::GET, "GET"),
            (Method::HEAD, "HEAD"),
            (Method::POST, "POST"),
            (Method::PUT, "PUT"),
            (Method::PATCH, "PATCH"),
            (Method::DELETE, "DELETE"),
            (Method::OPTIONS, "OPTIONS"),
            (Method::TRACE, "other"),
            (Method::CONNECT, "other"),
            (Method::from_bytes(b"JUNK1").expect("method"), "other"),
        ] {
            assert_eq!(MethodLabel::of(&method).as_str(), label, "{method}");
        }
    }
}
