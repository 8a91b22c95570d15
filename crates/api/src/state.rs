//! The state every handler shares.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use payments_idempotency::engine::{Engine, RecentAnswers, ResponseCache};
use payments_idempotency_axum::Attempts;
use payments_redis::{EventStream, ReplayCache};
use payments_storage::{Store, Transaction};

use payments_domain::SettlementReport;

use crate::admission::Limits;
use crate::auth::ApiKeys;
use crate::metrics::EngineMetrics;
use crate::operations::{Operations, Ports, Processor};
use crate::reconcile::Reconciler;

/// Shared by every request; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The database, PostgreSQL or SQLite: the handlers see only the repositories.
    pub store: Arc<dyn Store>,
    pub api_keys: ApiKeys,
    pub limits: Limits,
    /// The Redis replay cache, when Redis is configured (the engine's cache port).
    pub cache: Option<Arc<ReplayCache>>,
    /// The stream the outbox relay publishes to, when Redis is configured (behind an `Arc`,
    /// as everything here, so that a request's copy of the state allocates nothing).
    pub events: Option<Arc<EventStream>>,
    /// Renders `/metrics` on the metrics listener; `None` if this process has no recorder of
    /// its own.
    pub metrics: Option<PrometheusHandle>,
    /// The exactly-once engine, over the store's records and the cache, with every
    /// operation below registered for the completer.
    pub engine: Arc<Engine<Transaction>>,
    /// The processor's settlement report, for reconciliation.
    pub settlement: Arc<dyn SettlementReport>,
    /// The operations the engine runs.
    pub(crate) operations: Operations,
    /// The idempotent attempts running, each on a task of its own so that its client going
    /// away does not stop it halfway; the service waits for them when it stops.
    pub(crate) attempts: Attempts,
}

impl AppState {
    /// The state over `store` and `processor`, its engine holding up to
    /// `recent_answers_bytes` of recent answers (none if 0) before `cache`, the Redis replay
    /// cache if any; a hold may wait `authorization_window` for its capture.
    pub fn new(
        store: Arc<dyn Store>,
        processor: Arc<dyn Processor>,
        api_keys: ApiKeys,
        limits: Limits,
        recent_answers_bytes: usize,
        cache: Option<ReplayCache>,
        authorization_window: Duration,
    ) -> Self {
        let settlement: Arc<dyn SettlementReport> = processor.clone();
        let ports = Ports::new(Arc::clone(&store), processor, authorization_window);
        let operations = Operations::new(&ports);
        let cache = cache.map(Arc::new);
        let engine = store
            .records()
            .engine()
            .with_observer(Arc::new(EngineMetrics));
        let mut engine = operations.register(engine);
        if recent_answers_bytes > 0 {
            engine = engine.with_recent_answers(RecentAnswers::new(recent_answers_bytes));
        }
        if let Some(cache) = &cache {
            engine = engine.with_cache(Arc::clone(cache) as Arc<dyn ResponseCache>);
        }
        Self {
            store,
            api_keys,
            limits,
            cache,
            events: None,
            metrics: None,
            engine: Arc::new(engine),
            settlement,
            operations,
            attempts: Attempts::new(),
        }
    }

    /// Reconciliation over this state's database, engine and processor.
    pub(crate) fn reconciler(&self) -> Reconciler {
        Reconciler {
            store: Arc::clone(&self.store),
            engine: Arc::clone(&self.engine),
            report: Arc::clone(&self.settlement),
        }
    }
}
