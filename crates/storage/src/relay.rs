//! Where the outbox relay publishes: the port [`EventSink`], which `payments-redis`'s
//! `EventStream` implements over a Redis stream, written at least once.

use async_trait::async_trait;
use uuid::Uuid;

use crate::StoreError;

/// Where the outbox relay publishes events. The relay marks a batch published only after
/// [`publish`](Self::publish) succeeded, and publishes it again after a failure, so a sink
/// receives every event at least once; each carries its `id` for consumers to tell repeats.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Publishes every event of the batch, or fails as a whole.
    async fn publish(&self, events: &[OutboxEvent]) -> Result<(), SinkError>;
}

/// A sink that could not take a batch; the relay backs off and publishes it again.
#[derive(Debug, thiserror::Error)]
#[error("the event sink failed")]
pub struct SinkError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// An outbox row on its way to the stream.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxEvent {
    pub id: Uuid,
    pub event_type: String,
    pub payload: String,
}

/// Why a relay round published nothing.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("publishing the events failed")]
    Sink(#[from] SinkError),
}
