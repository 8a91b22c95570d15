//! The outbox relay: unpublished `outbox_events` rows go to a Redis stream, at least once.

use redis::Pipeline;
use uuid::Uuid;

use crate::redis_link::{RedisFailure, RedisLink};
use crate::{PgStore, StoreError};

/// Publishes events to one Redis stream.
#[derive(Debug, Clone)]
pub struct EventStream {
    link: RedisLink,
    stream: String,
}

/// An outbox row on its way to the stream.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxEvent {
    pub id: Uuid,
    pub event_type: String,
    pub payload: String,
}

impl EventStream {
    pub fn new(link: RedisLink, stream: impl Into<String>) -> Self {
        Self {
            link,
            stream: stream.into(),
        }
    }

    pub fn name(&self) -> &str {
        &self.stream
    }

    /// `XADD`s every event in one pipeline. Each entry carries `event_id`, so a consumer that
    /// receives an event twice (delivery is at least once) can tell.
    pub async fn publish(&self, events: &[OutboxEvent]) -> Result<(), RedisFailure> {
        let mut pipe = Pipeline::new();
        for event in events {
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("*")
                .arg("event_id")
                .arg(event.id.to_string())
                .arg("type")
                .arg(&event.event_type)
                .arg("payload")
                .arg(&event.payload)
                .ignore();
        }
        self.link.query_pipeline::<()>(&pipe).await
    }
}

/// Why a relay round published nothing.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("publishing to the stream failed")]
    Stream(#[from] RedisFailure),
}

/// Unpublished events: how many, and how long the oldest has waited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub unpublished: i64,
    pub oldest_age_secs: f64,
}

impl PgStore {
    /// Publishes up to `batch` unpublished events and marks them published; returns how many.
    ///
    /// The rows are locked with `FOR UPDATE SKIP LOCKED` for the round, so relays on several
    /// instances take disjoint rows and never publish one row twice between them. The rows are
    /// marked only after the stream accepted them, in the same transaction: if Redis fails they
    /// stay unpublished for the next round; if the commit fails after the XADD, the next round
    /// publishes them again (at least once, never lost).
    pub async fn relay_outbox(
        &self,
        batch: i64,
        stream: &EventStream,
    ) -> Result<usize, RelayError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        let events: Vec<OutboxEvent> = sqlx::query_as(
            "SELECT id, event_type, payload::text AS payload FROM outbox_events
             WHERE published_at IS NULL
             ORDER BY created_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        if events.is_empty() {
            return Ok(0);
        }
        stream.publish(&events).await?;
        let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
        sqlx::query("UPDATE outbox_events SET published_at = now() WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(events.len())
    }

    /// The size and age of the unpublished backlog.
    pub async fn outbox_backlog(&self) -> Result<Backlog, StoreError> {
        let (unpublished, oldest_age_secs): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
             FROM outbox_events WHERE published_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            unpublished,
            oldest_age_secs: oldest_age_secs.unwrap_or(0.0),
        })
    }
}
