//! The event stream's bounds: its length, the time a publish may take, and what a consumer
//! that died leaves behind.

use std::time::Duration;

use futures::future::join_all;

use crate::events::{assert_each_event_once, sample, scrape, unpublished, wait_until_published};
use crate::helpers::{
    Backend, Service, TestDatabase, count_rows, new_key, stream_for, test_redis_url, visa,
};
use crate::redis_server::SlowRedis;

async fn stream_length(stream: &str) -> i64 {
    let client = redis::Client::open(test_redis_url()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    redis::cmd("XLEN")
        .arg(stream)
        .query_async(&mut conn)
        .await
        .expect("XLEN")
}

/// Approximate trimming (`MAXLEN ~`) drops whole nodes of 100 entries, so with a cap of 10 the
/// first 100 events are trimmed once 110 are in: 150 events leave about 50, and never fewer
/// than 10. Without the cap all 150 would stay.
async fn the_stream_is_capped_and_the_relay_still_publishes_every_event(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[("PAYMENTS__REDIS__STREAM_MAX_LEN", "10")]).await;
    let body = visa(100);
    for _ in 0..15 {
        let keys: Vec<String> = (0..10).map(|_| new_key()).collect();
        let responses = join_all(keys.iter().map(|key| service.post_charge(key, &body))).await;
        assert!(responses.iter().all(|r| r.status().as_u16() == 201));
    }

    wait_until_published(&db).await;
    assert_eq!(count_rows(&db.pool, "outbox_events").await, 150);
    assert_eq!(unpublished(&db).await, 0, "every event was published");
    let length = stream_length(&stream_for(&db.url)).await;
    assert!(
        (10..150).contains(&length),
        "150 events on a stream capped at about 10 left {length} entries"
    );
}

/// A Redis that answers every call after 400 ms: slower than the cache may wait
/// (`redis.timeout_ms`, 100 ms), well within what the relay may (`redis.stream_timeout_ms`).
async fn a_redis_slower_than_the_cache_timeout_still_receives_every_event(backend: Backend) {
    let slow = SlowRedis::start(&test_redis_url(), Duration::from_millis(400)).await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[("PAYMENTS__REDIS__URL", &slow.url())]).await;
    for _ in 0..3 {
        assert_eq!(
            service
                .post_charge(&new_key(), &visa(100))
                .await
                .status()
                .as_u16(),
            201
        );
    }

    wait_until_published(&db).await;
    assert_each_event_once(&db, &test_redis_url(), 3).await;
    // The cache kept its own, short bound: requests did not wait for the slow Redis.
    let metrics = scrape(&service).await;
    assert!(
        sample(
            &metrics,
            "redis_errors_total",
            &[("operation", "cache_get")]
        ) >= 1.0
    );
}

on_every_backend!(
    a_redis_slower_than_the_cache_timeout_still_receives_every_event,
    the_stream_is_capped_and_the_relay_still_publishes_every_event,
);
