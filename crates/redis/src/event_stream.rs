//! The sink the service's outbox relay publishes through: a Redis stream, written at least
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use payments_storage::{EventSink, OutboxEvent, SinkError};
use redis::{Pipeline, Value};

use crate::link::{RedisFailure, RedisLink};

/// Publishes events to one Redis stream, capped at about `max_len` entries, and, when the
/// Redis master has replicas, only once one of them has the batch too.
#[derive(Debug, Clone)]
pub struct EventStream {
    link: RedisLink,
    stream: String,
    max_len: u64,
    /// Whether the master had replicas when last asked, so that the next batch waits for one.
    replicated: Arc<AtomicBool>,
}

/// The master has replicas but none confirmed the batch in time: a failover now could lose it,
/// so it is not marked published and goes out again.
#[derive(Debug, thiserror::Error)]
#[error("no replica of the Redis master confirmed the batch within {0:?}")]
struct NotReplicated(Duration);

impl EventStream {
    /// A stream that keeps at least its last `max_len` entries and trims older ones.
    pub fn new(link: RedisLink, stream: impl Into<String>, max_len: u64) -> Self {
        Self {
            link,
            stream: stream.into(),
            max_len,
            replicated: Arc::new(AtomicBool::new(false)),
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
    /// A batch on a master with replicas counts as published only once `WAIT` says a replica
    /// has it: Sentinel promotes a replica when the master dies, and events the master had
    /// acknowledged but not yet sent on would be gone from the stream while their rows said
    /// published. The same pipeline asks `INFO replication` first; a batch sent while the
    /// master was thought to have none but found to have some is published again, this time
    /// with its `WAIT`. With no replicas, a batch counts as published once the master has it.
    ///
    /// Every `XADD` trims the stream to about `max_len` entries: the database keeps the events,
    /// so the stream is only a window for consumers, and without a cap it would grow for as
    /// long as Redis lives. `~` lets Redis drop only whole nodes (100 entries by default),
    /// which costs nothing per entry; the stream then holds somewhat more than `max_len`,
    /// never fewer.
    async fn publish(&self, events: &[OutboxEvent]) -> Result<(), SinkError> {
        let failed = |error: Box<dyn std::error::Error + Send + Sync>| SinkError(error);
        let waits = self.replicated.load(Ordering::Relaxed);
        // Half the link's bound, so that a replica that does not answer fails the batch here
        // rather than by the connection's timeout, which would also drop the connection.
        let wait = self.link.timeout() / 2;
        let mut pipe = Pipeline::new();
        pipe.cmd("INFO").arg("replication");
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
        if waits {
            let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
            pipe.cmd("WAIT").arg(1).arg(millis);
        }
        let replies: Vec<Value> = self
            .link
            .query_pipeline(&pipe)
            .await
            .map_err(|failure: RedisFailure| failed(Box::new(failure)))?;
        let info: String = match replies.first() {
            Some(reply) => redis::from_redis_value(reply).map_err(|e| failed(Box::new(e)))?,
            None => String::new(),
        };
        let has_replicas = connected_replicas(&info) > 0;
        self.replicated.store(has_replicas, Ordering::Relaxed);
        if !has_replicas {
            return Ok(());
        }
        let confirmed: i64 = match (waits, replies.get(1)) {
            (true, Some(reply)) => {
                redis::from_redis_value(reply).map_err(|e| failed(Box::new(e)))?
            }
            _ => 0,
        };
        if confirmed < 1 {
            return Err(failed(Box::new(NotReplicated(wait))));
        }
        Ok(())
    }
}

/// The `connected_slaves` of an `INFO replication` reply: the master's replicas (0 for a
/// replica, or a reply without the field).
fn connected_replicas(info: &str) -> u64 {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("connected_slaves:"))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replicas_are_read_from_info_replication() {
        let master = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=..\r\n";
        assert_eq!(connected_replicas(master), 2);
        assert_eq!(
            connected_replicas("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"),
            0
        );
        assert_eq!(
            connected_replicas("role:slave\r\nmaster_host:127.0.0.1\r\n"),
            0
        );
        assert_eq!(connected_replicas(""), 0);
    }
}
