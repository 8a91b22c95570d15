//! `payments-api events tail`: follows the `payment.completed` stream and prints each event
//! once, as one JSON line, so people can watch the outbox relay at work.
//!
//! It reads with a consumer group (`events.tail` by default, or `PAYMENTS_TAIL_GROUP`), which
//! starts at the beginning of the stream and remembers what it acknowledged: a restarted tail
//! continues where it stopped. Entries that a tail of the group read but never acknowledged
//! (it died in between) are taken over with `XAUTOCLAIM` once they have been idle long enough,
//! at start and then periodically. Delivery is at least once, so it also skips an `event_id`
//! it printed recently; a real consumer deduplicates the same way.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, RedisResult};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::config::{Settings, StartupError};

/// How many event ids the tail remembers to skip repeated deliveries: enough to span any
/// redelivery in practice, and a fixed amount of memory however long the tail runs.
const REMEMBERED: usize = 10_000;

/// How long another consumer's entry must have been pending before it is taken over, unless
/// `PAYMENTS_TAIL_CLAIM_IDLE_MS` says otherwise. A live tail acknowledges an entry right after
/// printing it, so an entry pending this long belongs to a tail that died.
const CLAIM_IDLE_MS: u64 = 5_000;

/// Entries read, or taken over, per call.
const BATCH: usize = 100;

/// Follows the stream until interrupted.
pub async fn tail_events() -> Result<(), StartupError> {
    let settings = Settings::load()?;
    let redis = settings.redis;
    if redis.url.trim().is_empty() {
        return Err(StartupError::Invalid {
            key: "redis.url",
            reason: "Redis is disabled; there is no stream to tail".into(),
        });
    }
    let claim_idle_ms = match std::env::var("PAYMENTS_TAIL_CLAIM_IDLE_MS") {
        Ok(text) => text.parse::<u64>().map_err(|e| StartupError::Invalid {
            key: "PAYMENTS_TAIL_CLAIM_IDLE_MS",
            reason: format!("{text:?} is not a number of milliseconds ({e})"),
        })?,
        Err(_) => CLAIM_IDLE_MS,
    };
    let fail = |e: redis::RedisError| StartupError::Invalid {
        key: "redis.url",
        reason: e.to_string(),
    };
    let client = redis::Client::open(redis.url.as_str()).map_err(fail)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(fail)?;
    let group = std::env::var("PAYMENTS_TAIL_GROUP").unwrap_or_else(|_| "events.tail".to_owned());

    // The group may exist already (a restarted tail): that is not an error.
    let created: RedisResult<()> = conn
        .xgroup_create_mkstream(&redis.stream, &group, "0")
        .await;
    if let Err(error) = created
        && error.code() != Some("BUSYGROUP")
    {
        return Err(fail(error));
    }
    eprintln!("following {} as group {group}", redis.stream);

    let mut tail = Tail {
        consumer: format!("tail-{}", std::process::id()),
        conn,
        stream: redis.stream,
        group,
        seen: Seen::new(REMEMBERED),
    };
    let options = StreamReadOptions::default()
        .group(&tail.group, &tail.consumer)
        .count(BATCH)
        .block(5_000);
    let claim_every = Duration::from_millis(claim_idle_ms);
    tail.take_over_abandoned(claim_idle_ms)
        .await
        .map_err(fail)?;
    let mut claimed_at = Instant::now();
    loop {
        let reply: StreamReadReply = tail
            .conn
            .xread_options(&[&tail.stream], &[">"], &options)
            .await
            .map_err(fail)?;
        for entry in reply.keys.into_iter().flat_map(|key| key.ids) {
            tail.deliver(entry).await;
        }
        // Checked after each read, which blocks at most 5 s when the stream is quiet.
        if claimed_at.elapsed() >= claim_every {
            tail.take_over_abandoned(claim_idle_ms)
                .await
                .map_err(fail)?;
            claimed_at = Instant::now();
        }
    }
}

/// One consumer of the group.
struct Tail {
    conn: MultiplexedConnection,
    stream: String,
    group: String,
    consumer: String,
    seen: Seen,
}

impl Tail {
    /// Takes over every entry of the group that has been pending for at least `min_idle_ms`
    /// (read by a consumer that never acknowledged it), and delivers it. Entries trimmed from
    /// the stream meanwhile are dropped from the pending list by Redis itself.
    async fn take_over_abandoned(&mut self, min_idle_ms: u64) -> RedisResult<()> {
        let mut start = "0-0".to_owned();
        loop {
            let reply: StreamAutoClaimReply = self
                .conn
                .xautoclaim_options(
                    &self.stream,
                    &self.group,
                    &self.consumer,
                    min_idle_ms,
                    &start,
                    StreamAutoClaimOptions::default().count(BATCH),
                )
                .await?;
            for entry in reply.claimed {
                self.deliver(entry).await;
            }
            // The scan of the pending list is complete when the cursor comes back to 0-0.
            if reply.next_stream_id == "0-0" {
                return Ok(());
            }
            start = reply.next_stream_id;
        }
    }

    /// Prints an entry's event unless it was printed recently, then acknowledges the entry.
    async fn deliver(&mut self, entry: StreamId) {
        let field = |name: &str| entry.get::<String>(name).unwrap_or_default();
        let event_id = field("event_id");
        if self.seen.first_time(&event_id) {
            let payload: Value = serde_json::from_str(&field("payload")).unwrap_or(Value::Null);
            println!(
                "{}",
                json!({ "event_id": event_id, "type": field("type"), "payload": payload })
            );
        }
        let _: RedisResult<i64> = self
            .conn
            .xack(&self.stream, &self.group, &[&entry.id])
            .await;
    }
}

/// The last `capacity` ids seen, oldest first out: a set for the lookup, a ring for the order.
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
    capacity: usize,
}

impl Seen {
    fn new(capacity: usize) -> Self {
        Self {
            ids: HashSet::with_capacity(capacity),
            order: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Whether `id` is not among the remembered ids; it is remembered from now on, and the
    /// oldest id is forgotten when the memory is full.
    fn first_time(&mut self, id: &str) -> bool {
        if self.ids.contains(id) {
            return false;
        }
        if self.order.len() >= self.capacity
            && let Some(oldest) = self.order.pop_front()
        {
            self.ids.remove(&oldest);
        }
        self.ids.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn a_repeated_id_is_skipped() {
        let mut seen = Seen::new(3);
        assert!(seen.first_time("a"));
        assert!(!seen.first_time("a"));
        assert!(seen.first_time("b"));
        assert!(!seen.first_time("a"));
    }

    #[test]
    fn memory_stays_bounded_and_forgets_the_oldest_first() {
        let mut seen = Seen::new(3);
        for id in ["a", "b", "c", "d"] {
            assert!(seen.first_time(id));
        }
        assert_eq!((seen.ids.len(), seen.order.len()), (3, 3));
        assert!(!seen.first_time("d"), "the newest are remembered");
        assert!(!seen.first_time("b"));
        assert!(seen.first_time("a"), "the oldest was forgotten");
        assert_eq!(seen.ids.len(), 3);
    }
}
