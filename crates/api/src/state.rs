//! The state every handler shares.

use std::collections::HashMap;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use payments_domain::{CardProcessor, TenantId};
use payments_storage::{EventStream, PgStore, ReplayCache};

use crate::completions::Completions;

/// API keys and the tenant each one authenticates.
#[derive(Clone)]
pub struct ApiKeys(Arc<HashMap<String, TenantId>>);

impl ApiKeys {
    pub fn new(keys: HashMap<String, TenantId>) -> Self {
        Self(Arc::new(keys))
    }

    /// The tenant a presented key belongs to.
    pub fn tenant_for(&self, presented: &str) -> Option<&TenantId> {
        self.0.get(presented)
    }
}

impl std::fmt::Debug for ApiKeys {
    // Never print the keys themselves.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("count", &self.0.len())
            .finish()
    }
}

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub body_limit_bytes: usize,
}

/// Shared by every request; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub store: PgStore,
    pub processor: Arc<dyn CardProcessor>,
    pub api_keys: ApiKeys,
    pub limits: Limits,
    pub completions: Completions,
    /// The Redis replay cache, when Redis is configured.
    pub cache: Option<ReplayCache>,
    /// The stream the outbox relay publishes to, when Redis is configured.
    pub events: Option<EventStream>,
    /// Renders `GET /metrics`; `None` if this process has no recorder of its own.
    pub metrics: Option<PrometheusHandle>,
}

impl AppState {
    pub fn new(
        store: PgStore,
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
        }
    }
}
