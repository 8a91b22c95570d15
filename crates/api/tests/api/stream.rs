//! The event stream's bounds: its length, the time a publish may take, and what a consumer
//! that died leaves behind.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use futures::future::join_all;
use redis::aio::MultiplexedConnection;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::events::{
    assert_each_event_once, outbox_ids, sample, scrape, stream_events, unpublished,
    wait_until_published,
};
use crate::helpers::{
    Backend, NO_RECENT_ANSWERS, Service, TestDatabase, count_rows, new_key, stream_for,
    test_redis_url, visa,
};
use crate::redis_server::{RedisServer, Sentinel, SlowRedis};

async fn redis_connection() -> MultiplexedConnection {
    let client = redis::Client::open(test_redis_url()).expect("redis url");
    client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
}

async fn stream_length(stream: &str) -> i64 {
    let mut conn = redis_connection().await;
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

/// Entries of `group` that one of its consumers read and has not acknowledged.
async fn pending(conn: &mut MultiplexedConnection, stream: &str, group: &str) -> i64 {
    // The summary form: the count, the lowest and highest ids, the count per consumer.
    let (count, ..): (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(conn)
        .await
        .expect("XPENDING");
    count
}

/// A tail of `group` died after reading every event and before acknowledging any: its entries
/// stay pending in the group, and a tail started later must take them over and print each one,
/// once.
async fn events_tail_takes_over_what_a_dead_tail_left_pending(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[]).await;
    for _ in 0..3 {
        let response = service.post_charge(&new_key(), &visa(100)).await;
        assert_eq!(response.status().as_u16(), 201);
    }
    wait_until_published(&db).await;

    // The dead tail: a consumer of the group that reads and never acknowledges.
    let stream = stream_for(&db.url);
    let group = format!("tail-{}", uuid::Uuid::new_v4().simple());
    let mut conn = redis_connection().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(&group)
        .arg("0")
        .query_async(&mut conn)
        .await
        .expect("XGROUP CREATE");
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&group)
        .arg("dead")
        .arg("COUNT")
        .arg(100)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut conn)
        .await
        .expect("XREADGROUP");
    assert_eq!(read.keys.iter().map(|k| k.ids.len()).sum::<usize>(), 3);
    assert_eq!(pending(&mut conn, &stream, &group).await, 3);
    // Idle for longer than the tail below waits before taking an entry over.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut tail = Command::new(env!("CARGO_BIN_EXE_payments-api"))
        .args(["events", "tail"])
        .env_clear()
        .env("PAYMENTS__REDIS__URL", test_redis_url())
        .env("PAYMENTS__REDIS__STREAM", &stream)
        .env("PAYMENTS_TAIL_GROUP", &group)
        .env("PAYMENTS_TAIL_CLAIM_IDLE_MS", "200")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the tail");
    let mut lines = BufReader::new(tail.stdout.take().expect("stdout")).lines();
    // Every line it prints until none comes for 3 s; the first may take a while to come.
    let mut printed: HashMap<String, usize> = HashMap::new();
    let mut wait = Duration::from_secs(20);
    while let Ok(line) = tokio::time::timeout(wait, lines.next_line()).await {
        let line = line.expect("read").expect("the tail is running");
        let event: Value = serde_json::from_str(&line).expect("one JSON object per line");
        let id = event["event_id"].as_str().unwrap_or_default().to_owned();
        *printed.entry(id).or_default() += 1;
        wait = Duration::from_secs(3);
    }

    assert!(
        printed.values().all(|&n| n == 1),
        "each event printed once: {printed:?}"
    );
    assert_eq!(
        printed.into_keys().collect::<HashSet<_>>(),
        outbox_ids(&db).await,
        "every event the dead tail left pending was printed"
    );
    assert_eq!(
        pending(&mut conn, &stream, &group).await,
        0,
        "and acknowledged"
    );
}

/// A master whose replica has stopped answering (Sentinel would promote that replica if the
/// master died now): the relay writes the batch to the master but does not mark it published
/// until `WAIT` says a replica has it. The batch goes out again until the replica is back, and
/// then every event is on the replica, and published. Without the `WAIT`, the rows would be
/// marked published while only the master, which a failover would drop, had their events.
async fn events_count_as_published_only_once_a_replica_has_them(backend: Backend) {
    let master = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(&master).await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[("PAYMENTS__REDIS__URL", &master.url())]).await;
    let stream = stream_for(&db.url);
    let on_replica = || async {
        let events = stream_events(&replica.url(), &stream).await;
        events
            .into_iter()
            .map(|(id, _)| id)
            .collect::<HashSet<String>>()
    };
    let failed_publishes = || async {
        sample(
            &scrape(&service).await,
            "redis_errors_total",
            &[("operation", "xadd")],
        )
    };
    assert_eq!(
        service.post_charge(&new_key(), &visa(100)).await.status(),
        201
    );
    wait_until_published(&db).await;
    assert_eq!(on_replica().await, outbox_ids(&db).await);

    replica.signal("-STOP");
    let before = failed_publishes().await;
    assert_eq!(
        service.post_charge(&new_key(), &visa(100)).await.status(),
        201
    );
    // Two failed publishes of the batch: the relay has tried, and tried again.
    for _ in 0..200 {
        if failed_publishes().await >= before + 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failed = failed_publishes().await - before;
    assert!(failed >= 2.0, "the relay failed {failed} publishes");
    assert_eq!(
        unpublished(&db).await,
        1,
        "published while no replica had it"
    );

    replica.signal("-CONT");
    wait_until_published(&db).await;
    assert_eq!(
        on_replica().await,
        outbox_ids(&db).await,
        "every event is on the replica"
    );
}

/// Redis through Sentinel: when the master dies, Sentinel promotes its replica, and the
/// replay cache and the relay follow it without a restart. Every event, those published before
/// the failover too, is on the new master (the relay waited for the replica to have them), and
/// a replay is served from the new master's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_and_the_relay_follow_a_sentinel_failover() {
    let mut master = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(&master).await;
    let sentinel = Sentinel::start("payments", &master).await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let service = service_through(&sentinel, &db, &[]).await;
    assert_eq!(
        service.post_charge(&new_key(), &visa(100)).await.status(),
        201
    );
    wait_until_published(&db).await;

    master.stop().await;
    sentinel.wait_for_master("payments", replica.port).await;
    let key = new_key();
    assert_eq!(service.post_charge(&key, &visa(100)).await.status(), 201);
    wait_until_published(&db).await;
    assert_eq!(events_on(&replica, &db).await, outbox_ids(&db).await);
    // The first replays may find the cache still reconnecting; one from the database puts the
    // entry on the new master, and the next is served from there.
    assert!(
        a_replay_comes_from_the_cache(&service, &key).await,
        "no replay was served from the new master's cache"
    );
}

/// The service on `db`, with Redis wherever `sentinel` names the master `payments`.
async fn service_through(sentinel: &Sentinel, db: &TestDatabase, env: &[(&str, &str)]) -> Service {
    let sentinels = format!("127.0.0.1:{}", sentinel.port);
    // Every replay reaches the cache: the service holds no recent answers of its own.
    let mut settings = vec![
        NO_RECENT_ANSWERS,
        ("PAYMENTS__REDIS__URL", ""),
        ("PAYMENTS__REDIS__SENTINEL_MASTER", "payments"),
        ("PAYMENTS__REDIS__SENTINELS", sentinels.as_str()),
    ];
    settings.extend_from_slice(env);
    Service::start(&db.url, &settings).await
}

/// The ids of the events on `redis`'s stream for `db`.
async fn events_on(redis: &RedisServer, db: &TestDatabase) -> HashSet<String> {
    stream_events(&redis.url(), &stream_for(&db.url))
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Replays `key` until one is served from the cache, 50 times at most: a cache write that
/// timed out (on a busy machine, or while the cache reconnects) leaves the next replay to the
/// database, which writes the entry again.
async fn a_replay_comes_from_the_cache(service: &Service, key: &str) -> bool {
    let from_cache = || async {
        let metrics = scrape(service).await;
        sample(
            &metrics,
            "idempotency_outcomes_total",
            &[("outcome", "replayed_cache")],
        )
    };
    for _ in 0..50 {
        assert_eq!(service.post_charge(key, &visa(100)).await.status(), 201);
        if from_cache().await > 0.0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A master and Sentinels that require passwords: the service presents each its own, so the
/// relay publishes every event to the master and replays are served from its cache.
#[tokio::test]
async fn the_cache_and_the_relay_reach_a_master_and_sentinels_that_require_passwords() {
    let master = RedisServer::start_requiring("master-secret").await;
    let sentinel = Sentinel::start_requiring("payments", &master, "sentinel-secret").await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let passwords = [
        ("PAYMENTS__REDIS__PASSWORD", "master-secret"),
        ("PAYMENTS__REDIS__SENTINEL_PASSWORD", "sentinel-secret"),
    ];
    let service = service_through(&sentinel, &db, &passwords).await;
    let key = new_key();
    assert_eq!(service.post_charge(&key, &visa(100)).await.status(), 201);
    assert_eq!(
        service.post_charge(&new_key(), &visa(100)).await.status(),
        201
    );
    wait_until_published(&db).await;
    let on_master = events_on(&master, &db).await;
    assert_eq!(on_master.len(), 2);
    assert_eq!(on_master, outbox_ids(&db).await);
    assert!(
        a_replay_comes_from_the_cache(&service, &key).await,
        "no replay was served from the master's cache"
    );
    assert_eq!(count_rows(&db.pool, "charges").await, 2);
}

on_every_backend!(
    events_count_as_published_only_once_a_replica_has_them,
    a_redis_slower_than_the_cache_timeout_still_receives_every_event,
    the_stream_is_capped_and_the_relay_still_publishes_every_event,
    events_tail_takes_over_what_a_dead_tail_left_pending,
);
