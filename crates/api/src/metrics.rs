//! Prometheus metrics: what matters about requests, idempotency outcomes, the processor, the
//! outbox and Redis. Rendered at `GET /metrics`.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use payments_domain::ItemResult;
use payments_idempotency::engine::{CacheCall, Checkpoint, Observer, Outcome, RecentAnswersHeld};
use payments_storage::{CommitObserver, Durability, GroupCommit, GroupCommits};

use crate::failpoint;

/// Latency buckets in seconds: from sub-millisecond replays to slow processor calls.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Writes per group commit (on SQLite, up to the most one holds), and finishes per batch (up
/// to the most one batch writes).
const COMMIT_WRITES_BUCKETS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// Installs the process-wide recorder; `None` if one is installed already.
pub(crate) fn install() -> Option<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .ok()?
        .set_buckets_for_metric(
            Matcher::Full("database_commit_writes".to_owned()),
            &COMMIT_WRITES_BUCKETS,
        )
        .ok()?
        .set_buckets_for_metric(
            Matcher::Full("idempotency_finish_batch_size".to_owned()),
            &COMMIT_WRITES_BUCKETS,
        )
        .ok()?
        .install_recorder()
        .ok()
}

/// The record store's group commits (every write's on SQLite, claims' on PostgreSQL):
/// their sizes as `database_commit_writes`, and the crash tests' failpoints inside and after
/// one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CommitMetrics;

impl CommitObserver for CommitMetrics {
    fn committing(&self, commit: GroupCommit) {
        histogram!("database_commit_writes").record(commit.writes as f64);
        failpoint::in_group_commit(commit);
    }

    fn committed(&self, commit: GroupCommit) {
        failpoint::after_group_commit_of_claims(commit);
    }
}

/// `database_commit_failures_total` and `database_writers_waiting`, from the upkeep.
pub(crate) fn record_group_commits(commits: GroupCommits) {
    counter!("database_commit_failures_total").absolute(commits.failed);
    gauge!("database_writers_waiting").set(commits.waiting as f64);
}

/// The engine's observer: its outcomes, effect calls and cache failures as metrics (with each
/// request's log carrying its outcome), and its checkpoints as the crash tests' failpoints.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EngineMetrics;

#[async_trait]
impl Observer for EngineMetrics {
    /// `idempotency_outcomes_total`, and the `idempotency.outcome` log field (inside the
    /// request span).
    fn outcome(&self, outcome: Outcome) {
        let name = outcome.as_str();
        counter!("idempotency_outcomes_total", "outcome" => name).increment(1);
        tracing::info!(idempotency.outcome = name, "idempotency outcome");
    }

    /// `processor_call_duration_seconds`, labelled by the operation's effect (its
    /// `Operation::EFFECT`, such as `charge`), a name fixed in the code.
    fn effect_called(&self, effect: &'static str, took: Duration) {
        histogram!("processor_call_duration_seconds", "operation" => effect)
            .record(took.as_secs_f64());
    }

    /// The processor reported an effect that is not the one requested (another amount or
    /// currency, or a status other than succeeded): it was not recorded.
    fn effect_mismatch(&self) {
        counter!("processor_mismatch_total").increment(1);
    }

    /// A replay-cache entry failed its MAC check or did not parse: it was not served.
    fn cache_rejected(&self) {
        counter!("replay_cache_rejected_total").increment(1);
    }

    fn cache_failed(&self, call: CacheCall) {
        redis_error(RedisCall::Cache(call));
    }

    /// `completer_settling`: the records the completer is settling now.
    fn settle_began(&self) {
        gauge!("completer_settling").increment(1.0);
    }

    fn settle_ended(&self) {
        gauge!("completer_settling").decrement(1.0);
    }

    /// How many finishes of an operation were written together: 1 for a finish alone.
    fn finishes_written(&self, operation: &'static str, finishes: usize) {
        histogram!("idempotency_finish_batch_size", "operation" => operation)
            .record(finishes as f64);
    }

    /// `recent_answers_bytes` and `recent_answers`: what the in-process answers hold.
    fn recent_answers(&self, held: RecentAnswersHeld) {
        gauge!("recent_answers_bytes").set(held.bytes as f64);
        gauge!("recent_answers").set(held.entries as f64);
    }

    async fn reached(&self, point: Checkpoint) {
        failpoint::hit(point).await;
    }
}

/// A Redis call that failed (and was worked around).
pub(crate) fn redis_error(call: RedisCall) {
    counter!("redis_errors_total", "operation" => call.as_str()).increment(1);
}

/// A Redis call that can fail and be worked around: the `operation` label of
/// `redis_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedisCall {
    /// A replay-cache call of the engine.
    Cache(CacheCall),
    /// Publishing outbox events to the stream (the relay tries again).
    Xadd,
}

impl RedisCall {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Cache(CacheCall::Get) => "cache_get",
            Self::Cache(CacheCall::Put) => "cache_put",
            Self::Cache(CacheCall::Forget) => "cache_forget",
            Self::Xadd => "xadd",
        }
    }
}

/// A reconciliation run: `reconciliation_items_total{result}` counts its items by how they
/// came out (a label from a fixed set), and `reconciliation_exceptions_open` is what is still
/// open, over every day.
pub(crate) fn record_reconciliation(counts: &[(ItemResult, usize)], open_exceptions: i64) {
    for &(result, n) in counts {
        counter!("reconciliation_items_total", "result" => result.as_str())
            .increment(u64::try_from(n).unwrap_or(u64::MAX));
    }
    gauge!("reconciliation_exceptions_open").set(open_exceptions as f64);
}

/// `database_commit_waits_for_standby`: 1 when a commit the database acknowledges is on a
/// synchronous standby too, 0 when it is only on the node that took it.
pub(crate) fn record_durability(durability: Durability) {
    let waits = durability == Durability::Standby;
    gauge!("database_commit_waits_for_standby").set(if waits { 1.0 } else { 0.0 });
}

pub(crate) fn outbox_backlog(unpublished: i64, oldest_age_secs: f64) {
    gauge!("outbox_backlog").set(unpublished as f64);
    gauge!("outbox_relay_lag_seconds").set(oldest_age_secs);
}

/// A request took an in-flight slot (`http_requests_in_flight`).
pub(crate) fn request_admitted() {
    gauge!("http_requests_in_flight").increment(1.0);
}

/// A request gave its in-flight slot back.
pub(crate) fn request_finished() {
    gauge!("http_requests_in_flight").decrement(1.0);
}

/// A connection was closed as soon as it was accepted: the instance had `server.max_connections`
/// open (`http_connections_refused_total`).
pub(crate) fn connection_refused() {
    counter!("http_connections_refused_total").increment(1);
}

pub(crate) fn events_published(count: usize) {
    counter!("outbox_events_published_total").increment(count as u64);
}

/// The `method` label: the standard methods by name, every other method as `other`. The
/// method is chosen by the client, so taking it verbatim would let anyone, without even
/// authenticating, add a series per request until the exporter runs out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MethodLabel {
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
    pub(crate) fn of(method: &Method) -> Self {
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

    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) async fn track_requests(request: Request, next: Next) -> Response {
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
