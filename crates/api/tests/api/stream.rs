//! The event stream's bounds: the time a publish may take, and what a consumer that died
//! leaves behind.

use std::time::Duration;

use crate::events::{assert_each_event_once, sample, scrape, wait_until_published};
use crate::helpers::{Backend, Service, TestDatabase, new_key, test_redis_url, visa};
use crate::redis_server::SlowRedis;

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

on_every_backend!(a_redis_slower_than_the_cache_timeout_still_receives_every_event,);
