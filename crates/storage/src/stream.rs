//! Where the outbox relay publishes ([`EventSink`]), and the sink the service uses: a Redis
//! stream, written at least once.

use async_trait::async_trait;
use redis::Pipeline;
use uuid::Uuid;

use crate::StoreError;
use crate::redis_link::{RedisFailure, RedisLink};

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

/// Publishes events to one Redis stream, capped at about `max_len` entries.
#[derive(Debug, Clone)]
pub struct EventStream {
    link: RedisLink,
    stream: String,
    max_len: u64,
}

/// An outbox row on its way to the stream.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxEvent {
    pub id: Uuid,
    pub event_type: String,
    pub payload: String,
}

impl EventStream {
    /// A stream that keeps at least its last `max_len` entries and trims older ones.
    pub fn new(link: RedisLink, stream: impl Into<String>, max_len: u64) -> Self {
        Self {
            link,
            stream: stream.into(),
            max_len,
        }
    }

    pub fn name(&self) -> &str {
        &self.stream
    }
}

#[async_trait]
impl EventSink for EventStream {
    /// `XADD`s every event in one pipeline. Each entry carries `event_id`, so a consumer that
    /// receives an event twice (delivery is at least once) can tell.
    ///
    /// Every `XADD` trims the stream to about `max_len` entries: the database keeps the events,
    /// so the stream is only a window for consumers, and without a cap it would grow for as
    /// long as Redis lives. `~` lets Redis drop only whole nodes (100 entries by default),
    /// which costs nothing per entry; the stream then holds somewhat more than `max_len`,
    /// never fewer.
    async fn publish(&self, events: &[OutboxEvent]) -> Result<(), SinkError> {
        let mut pipe = Pipeline::new();
        for event in events {
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("MAXLEN")
                .arg("~")
                .arg(self.max_len)
                .arg("*")
                .arg("event_id")
                .arg(event.id.to_string())
                .arg("type")
                .arg(&event.event_type)
                .arg("payload")
                .arg(&event.payload)
                .ignore();
        }
        self.link
            .query_pipeline::<()>(&pipe)
            .await
            .map_err(|failure: RedisFailure| SinkError(Box::new(failure)))
    }
}

/// Why a relay round published nothing.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("publishing the events failed")]
    Sink(#[from] SinkError),
}
