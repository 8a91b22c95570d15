//! The state every handler shares.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use payments_domain::CardProcessor;
use payments_storage::{EventStream, ReplayCache, Store};

use crate::auth::ApiKeys;
use crate::completions::Completions;
use crate::operations::charge::CreateCharge;
use crate::operations::refund::CreateRefund;
use crate::protocol::{Engine, Idempotent};

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub body_limit_bytes: usize,
    /// How long a client may take to send its body.
    pub body_timeout: std::time::Duration,
    /// Requests one instance handles at once, over all routes, before shedding load.
    pub max_in_flight: usize,
    /// The most of those one tenant may hold.
    pub max_in_flight_per_tenant: usize,
    /// Total bytes of request header names and values accepted.
    pub header_limit_bytes: usize,
    /// The longest a whole request may take.
    pub request_timeout: std::time::Duration,
}

/// Shared by every request; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The database, PostgreSQL or SQLite: the handlers see only the repositories.
    pub store: Arc<dyn Store>,
    pub processor: Arc<dyn CardProcessor>,
    pub api_keys: ApiKeys,
    pub limits: Limits,
    pub completions: Completions,
    /// The Redis replay cache, when Redis is configured.
    pub cache: Option<ReplayCache>,
    /// The stream the outbox relay publishes to, when Redis is configured.
    pub events: Option<EventStream>,
    /// Renders `/metrics` on the metrics listener; `None` if this process has no recorder of
    /// its own.
    pub metrics: Option<PrometheusHandle>,
    /// The operations the protocol runs.
    pub charges: Arc<Idempotent<CreateCharge>>,
    pub refunds: Arc<Idempotent<CreateRefund>>,
}

impl AppState {
    /// The protocol's view of the shared state: the ports it works through, nothing else.
    pub(crate) fn engine(&self) -> Engine<'_> {
        Engine {
            store: self.store.as_ref(),
            processor: self.processor.as_ref(),
            cache: self.cache.as_ref(),
            completions: &self.completions,
        }
    }

    pub fn new(
        store: Arc<dyn Store>,
        processor: Arc<dyn CardProcessor>,
        api_keys: ApiKeys,
        limits: Limits,
    ) -> Self {
        Self {
            store,
            processor,
            api_keys,
            limits,
            completions: Completions::default(),
            cache: None,
            events: None,
            metrics: None,
            charges: Arc::default(),
            refunds: Arc::default(),
        }
    }
}
