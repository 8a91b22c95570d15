//! Redis as accelerator and transport: the outbox relay, the replay cache, metrics. Redis is
//! never the source of truth: without it nothing fails that would succeed with it, nothing is
//! charged twice and no event is lost.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::helpers::{
    Backend, NO_RECENT_ANSWERS, Service, TestDatabase, metrics_text, new_key, problem, stream_for,
    test_redis_url, visa,
};
use crate::redis_server::RedisServer;

pub(crate) async fn unpublished(db: &TestDatabase) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

/// Waits (bounded) until the relay has published every outbox row.
pub(crate) async fn wait_until_published(db: &TestDatabase) {
    for _ in 0..200 {
        if unpublished(db).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the relay did not publish the outbox");
}

/// The `event_id`s on a stream, in stream order, with their types.
pub(crate) async fn stream_events(redis_url: &str, stream: &str) -> Vec<(String, String)> {
    let client = redis::Client::open(redis_url).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    reply
        .ids
        .iter()
        .map(|entry| {
            (
                entry.get::<String>("event_id").unwrap_or_default(),
                entry.get::<String>("type").unwrap_or_default(),
            )
        })
        .collect()
}

pub(crate) async fn outbox_ids(db: &TestDatabase) -> HashSet<String> {
    let sql = format!("SELECT {} FROM outbox_events", db.uuid_text("id"));
    let ids: Vec<String> = sqlx::query_scalar(&sql)
        .fetch_all(&db.pool)
        .await
        .expect("ids");
    ids.into_iter().collect()
}

/// Asserts the stream holds every outbox event exactly once.
pub(crate) async fn assert_each_event_once(db: &TestDatabase, redis_url: &str, expected: usize) {
    let events = stream_events(redis_url, &stream_for(&db.url)).await;
    assert_eq!(events.len(), expected, "one stream entry per charge");
    let ids: HashSet<String> = events.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids.len(), expected, "no event twice");
    assert_eq!(ids, outbox_ids(db).await, "exactly the outbox's events");
    assert!(events.iter().all(|(_, kind)| kind == "payment.completed"));
}

async fn two_relays_publish_every_completed_charge_exactly_once(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    // Two instances, so two relays race for the same outbox rows.
    let instances = [
        Service::start(&db.url, &[]).await,
        Service::start(&db.url, &[]).await,
    ];
    let keys: Vec<String> = (0..30).map(|_| new_key()).collect();
    let body = visa(100);
    let responses = join_all(
        keys.iter()
            .enumerate()
            .map(|(i, key)| instances[i % 2].post_charge(key, &body)),
    )
    .await;
    assert!(responses.iter().all(|r| r.status().as_u16() == 201));

    wait_until_published(&db).await;
    assert_each_event_once(&db, &test_redis_url(), 30).await;
}

async fn with_redis_stopped_charges_and_replays_go_on_and_no_event_is_lost_or_repeated(
    backend: Backend,
) {
    let mut redis = RedisServer::start().await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[("PAYMENTS__REDIS__URL", &redis.url())]).await;

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

    redis.stop().await;
    let mut keys = Vec::new();
    for _ in 0..3 {
        let key = new_key();
        assert_eq!(
            service
                .post_charge(&key, &visa(250))
                .await
                .status()
                .as_u16(),
            201,
            "Redis down fails nothing"
        );
        keys.push(key);
    }
    let replay = service.post_charge(&keys[0], &visa(250)).await;
    assert_eq!(replay.status().as_u16(), 201);
    assert_eq!(
        replay.headers()["idempotent-replayed"],
        "true",
        "replayed from PostgreSQL"
    );
    let (status, _) = problem(service.post_charge(&keys[0], &visa(999)).await).await;
    assert_eq!(status, 422);
    assert_eq!(unpublished(&db).await, 3, "events wait in the outbox");

    redis.restart().await;
    wait_until_published(&db).await;
    assert_each_event_once(&db, &redis.url(), 6).await;
}

/// The value of one sample in a Prometheus text exposition, 0 when absent.
pub(crate) fn sample(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub(crate) async fn scrape(service: &Service) -> String {
    metrics_text(&service.metrics_url).await
}

/// Scrapes `service` until `shown` holds of its metrics, for 30 s at most: what a worker
/// reports on its own schedule may come after the answers a test waited for.
pub(crate) async fn scrape_until(
    service: &Service,
    what: &str,
    shown: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = scrape(service).await;
        if shown(&metrics) {
            return metrics;
        }
        assert!(Instant::now() < deadline, "{what}, not within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_replay_is_served_from_the_cache_and_a_cached_other_payload_is_still_422(
    backend: Backend,
) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[NO_RECENT_ANSWERS]).await;
    let key = new_key();
    let first = service
        .post_charge(&key, &visa(100))
        .await
        .bytes()
        .await
        .expect("body");

    let replay = service.post_charge(&key, &visa(100)).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body"), first);
    let (status, body) = problem(service.post_charge(&key, &visa(101)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );

    let metrics = scrape(&service).await;
    let outcome = |name| sample(&metrics, "idempotency_outcomes_total", &[("outcome", name)]);
    assert_eq!(outcome("replayed_cache"), 1.0);
    assert_eq!(outcome("replayed_db"), 0.0, "the database was not asked");
    assert_eq!(outcome("mismatch"), 1.0);
}

async fn a_replay_from_the_database_refills_the_cache(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[NO_RECENT_ANSWERS]).await;
    let key = new_key();
    assert_eq!(
        service
            .post_charge(&key, &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );

    // Lose the cache, as a Redis restart or eviction would.
    let client = redis::Client::open(test_redis_url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let pattern = format!(
        "test:{}:replay:*",
        db.url.rsplit('/').next().unwrap_or_default()
    );
    let cached: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert_eq!(cached.len(), 1, "the first response was cached");
    let _: i64 = redis::cmd("DEL")
        .arg(&cached)
        .query_async(&mut conn)
        .await
        .expect("DEL");

    for _ in 0..2 {
        assert_eq!(
            service.post_charge(&key, &visa(100)).await.headers()["idempotent-replayed"],
            "true"
        );
    }
    let metrics = scrape(&service).await;
    let outcome = |name| sample(&metrics, "idempotency_outcomes_total", &[("outcome", name)]);
    assert_eq!(
        (outcome("replayed_db"), outcome("replayed_cache")),
        (1.0, 1.0)
    );
}

async fn metrics_count_requests_outcomes_and_processor_calls(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[]).await;
    let before = scrape(&service).await;
    let created = |m: &str| {
        sample(
            m,
            "http_requests_total",
            &[("route", "/charges"), ("method", "POST"), ("status", "201")],
        )
    };
    assert_eq!(created(&before), 0.0);

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
    let key = new_key();
    let slow =
        serde_json::json!({ "amount": 100, "currency": "usd", "source": "tok_chargeDeclined" });
    assert_eq!(
        service.post_charge(&key, &slow).await.status().as_u16(),
        402
    );

    let after = scrape(&service).await;
    assert_eq!(created(&after), 3.0);
    assert_eq!(
        sample(
            &after,
            "http_requests_total",
            &[("route", "/charges"), ("status", "402")]
        ),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            "idempotency_outcomes_total",
            &[("outcome", "executed")]
        ),
        4.0
    );
    assert_eq!(
        sample(
            &after,
            "processor_call_duration_seconds_count",
            &[("operation", "charge")]
        ),
        4.0
    );
    assert!(
        sample(
            &after,
            "http_request_duration_seconds_count",
            &[("route", "/charges")]
        ) >= 4.0
    );
    // The relay reports after its first round, which nothing above waited for.
    scrape_until(&service, "the relay reports the backlog", |metrics| {
        metrics.contains("outbox_backlog")
    })
    .await;
}

async fn events_tail_prints_each_event_once(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[]).await;
    let mut tail = Command::new(env!("CARGO_BIN_EXE_payments-api"))
        .args(["events", "tail"])
        .env_clear()
        .env("PAYMENTS__REDIS__URL", test_redis_url())
        .env("PAYMENTS__REDIS__STREAM", stream_for(&db.url))
        .env(
            "PAYMENTS_TAIL_GROUP",
            format!("tail-{}", uuid::Uuid::new_v4().simple()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the tail");
    for _ in 0..2 {
        assert_eq!(
            service
                .post_charge(&new_key(), &visa(100))
                .await
                .status()
                .as_u16(),
            201
        );
    }

    let mut lines = BufReader::new(tail.stdout.take().expect("stdout")).lines();
    let mut printed = Vec::new();
    while printed.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the tail printed the events")
            .expect("read")
            .expect("a line");
        let event: Value = serde_json::from_str(&line).expect("one JSON object per line");
        assert_eq!(event["type"], "payment.completed");
        assert_eq!(event["payload"]["schema_version"], 1);
        printed.push(event["event_id"].as_str().unwrap_or_default().to_owned());
    }
    let printed: HashSet<String> = printed.into_iter().collect();
    assert_eq!(printed, outbox_ids(&db).await);
    // Nothing more arrives: each event was printed once.
    let extra = tokio::time::timeout(Duration::from_millis(1_500), lines.next_line()).await;
    assert!(extra.is_err(), "no third line: {extra:?}");
}

on_every_backend!(
    two_relays_publish_every_completed_charge_exactly_once,
    with_redis_stopped_charges_and_replays_go_on_and_no_event_is_lost_or_repeated,
    a_replay_is_served_from_the_cache_and_a_cached_other_payload_is_still_422,
    a_replay_from_the_database_refills_the_cache,
    metrics_count_requests_outcomes_and_processor_calls,
    events_tail_prints_each_event_once,
);
