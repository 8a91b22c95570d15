//! `payments-api events tail`: follows the `payment.completed` stream and prints each event
//! once, as one JSON line, so people can watch the outbox relay at work.
//!
//! It reads with a consumer group (`events.tail` by default, or `PAYMENTS_TAIL_GROUP`), which
//! starts at the beginning of the stream and remembers what it acknowledged: a restarted tail
//! continues where it stopped. Delivery is at least once, so it also skips an `event_id` it
//! has already printed; a real consumer deduplicates the same way.

use std::collections::HashSet;

use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use serde_json::{Value, json};

use crate::config::{Settings, StartupError};

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
    let consumer = format!("tail-{}", std::process::id());

    // The group may exist already (a restarted tail): that is not an error.
    let created: redis::RedisResult<()> = conn
        .xgroup_create_mkstream(&redis.stream, &group, "0")
        .await;
    if let Err(error) = created
        && error.code() != Some("BUSYGROUP")
    {
        return Err(fail(error));
    }
    eprintln!("following {} as group {group}", redis.stream);

    let options = StreamReadOptions::default()
        .group(&group, &consumer)
        .count(100)
        .block(5_000);
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        let reply: StreamReadReply = conn
            .xread_options(&[&redis.stream], &[">"], &options)
            .await
            .map_err(fail)?;
        for entry in reply.keys.into_iter().flat_map(|key| key.ids) {
            let field = |name: &str| entry.get::<String>(name).unwrap_or_default();
            let event_id = field("event_id");
            if seen.insert(event_id.clone()) {
                let payload: Value = serde_json::from_str(&field("payload")).unwrap_or(Value::Null);
                println!(
                    "{}",
                    json!({ "event_id": event_id, "type": field("type"), "payload": payload })
                );
            }
            let _: redis::RedisResult<i64> = conn.xack(&redis.stream, &group, &[&entry.id]).await;
        }
    }
}
