//! Several instances, slow attempts overtaken by their successors, a lost database, waiting
//! duplicates and expiry: each against real processes.

use std::time::Duration;

use futures::future::join_all;
use futures::stream::{self, StreamExt};
use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::events::sample;
use crate::helpers::{
    ACME, Backend, Footprint, Service, TWO_SECOND_RETENTION, TestDatabase, count_rows, http_client,
    metrics_text, new_key, problem, visa,
};
use crate::relay::Relay;

fn processor(card_sim: &CardSim) -> (&'static str, &str) {
    ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str())
}

async fn three_instances_and_two_hundred_concurrent_duplicates_charge_once(backend: Backend) {
    let card_sim = CardSim::start_with_latency_ms(200).await;
    let db = TestDatabase::create(backend).await;
    let env = [processor(&card_sim)];
    let instances = [
        Service::start(&db.url, &env).await,
        Service::start(&db.url, &env).await,
        Service::start(&db.url, &env).await,
    ];
    let key = new_key();
    let body = visa(2500);

    let requests = (0..200).map(|i| instances[i % 3].post_charge(&key, &body));
    let mut answers = Vec::new();
    for response in join_all(requests).await {
        let status = response.status().as_u16();
        answers.push((status, response.bytes().await.expect("body")));
    }

    assert!(
        answers
            .iter()
            .all(|(status, _)| *status == 201 || *status == 409),
        "only 201 or 409"
    );
    let bodies: std::collections::HashSet<_> = answers
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b.clone())
        .collect();
    assert_eq!(bodies.len(), 1, "every 201 is the same charge");
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

/// The settings of a race between client attempts: one-second locks, so that a paused attempt
/// is overtaken, a processor timeout within them, and the completer out of the race.
fn racing_attempts(card_sim: &CardSim) -> [(&'static str, &str); 4] {
    [
        processor(card_sim),
        ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "1"),
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "800"),
        ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "600000"),
    ]
}

async fn a_slow_attempt_overtaken_by_its_successor_writes_nothing_and_answers_the_replay(
    backend: Backend,
) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let common = racing_attempts(&card_sim);
    let mut slow_env = common.to_vec();
    slow_env.push(("PAYMENTS_PAUSE_AT", "after_charge:4000"));
    let slow = Service::start(&db.url, &slow_env).await;
    let fast = Service::start(&db.url, &common).await;
    let key = new_key();
    let body = visa(777);

    // Attempt 1 charges the card, then stalls past its lock.
    let first = spawn_charge(&slow, &key, &body);
    wait_for_stale_lock(&db, &key).await;

    // Attempt 2 takes the record over and finishes it; attempt 1 wakes fenced off.
    overtaken_answers_the_replay(&fast, &key, &body, first).await;
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM idempotency_records")
        .fetch_one(&db.pool)
        .await
        .expect("record");
    assert_eq!(attempts, 2);
}

/// An attempt that resumed a record from `charged` and then stalled past its lock is
/// overtaken the same way: its successor resumes and finishes first, and it answers the replay.
/// On PostgreSQL its finish takes no lock first, so its charge meets the one its successor
/// wrote (the generation is the charge's id) before its end could find the fence gone.
async fn a_resumed_attempt_overtaken_by_its_successor_writes_nothing_and_answers_the_replay(
    backend: Backend,
) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let common = racing_attempts(&card_sim);
    let with = |extra| {
        let mut env = common.to_vec();
        env.push(extra);
        env
    };
    let failing = Service::start(&db.url, &with(("PAYMENTS_FAIL_AT", "finish"))).await;
    let slow = Service::start(&db.url, &with(("PAYMENTS_PAUSE_AT", "after_claim:4000"))).await;
    let fast = Service::start(&db.url, &common).await;
    let key = new_key();
    let body = visa(779);

    // Attempt 1 charges the card and its finish fails: `charged` is left behind, the lock let go.
    let first = failing.post_charge(&key, &body).await;
    assert_eq!(first.status().as_u16(), 503);
    // Attempt 2 resumes from `charged`, then stalls past its lock.
    let second = spawn_charge(&slow, &key, &body);
    wait_for_attempt(&db, &key, 2).await;
    wait_for_stale_lock(&db, &key).await;

    // Attempt 3 takes the record over and finishes it, without calling the processor;
    // attempt 2 wakes fenced off.
    overtaken_answers_the_replay(&fast, &key, &body, second).await;
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

/// The successor, sent to `service`, takes the record over and finishes it (201, not a
/// replay); then the `overtaken` attempt wakes, writes nothing, and answers with the
/// successor's response as a replay.
async fn overtaken_answers_the_replay(
    service: &Service,
    key: &str,
    body: &Value,
    overtaken: tokio::task::JoinHandle<(u16, bool, Vec<u8>)>,
) {
    let successor = service.post_charge(key, body).await;
    assert_eq!(successor.status().as_u16(), 201);
    assert!(
        successor.headers().get("idempotent-replayed").is_none(),
        "the successor finished the record"
    );
    let successor_body = successor.bytes().await.expect("body").to_vec();
    let (status, replayed, overtaken_body) = overtaken.await.expect("the overtaken attempt");
    assert_eq!((status, replayed), (201, true));
    assert_eq!(overtaken_body, successor_body);
}

/// Waits until the record of `key` has been claimed or taken over `attempts` times.
async fn wait_for_attempt(db: &TestDatabase, key: &str, attempts: i32) {
    for _ in 0..100 {
        let at: Option<i32> = sqlx::query_scalar(
            "SELECT attempts FROM idempotency_records WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_optional(&db.pool)
        .await
        .expect("read record");
        if at == Some(attempts) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the record never reached attempt {attempts}");
}

/// A record reaped and claimed again restarts at attempt 1. A straggler of the old generation
/// (here: paused after its processor call while its record was deleted and the key claimed
/// anew) must not write into the new generation, although its attempt number matches.
async fn a_stale_writer_from_a_reaped_generation_writes_nothing(backend: Backend) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let common = [
        processor(&card_sim),
        ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "600000"),
    ];
    let mut straggler_env = common.to_vec();
    straggler_env.push(("PAYMENTS_PAUSE_AT", "after_charge:2000"));
    let mut successor_env = common.to_vec();
    successor_env.push(("PAYMENTS_PAUSE_AT", "after_claim:3000"));
    let straggler = Service::start(&db.url, &straggler_env).await;
    let successor = Service::start(&db.url, &successor_env).await;
    let key = new_key();
    let body = visa(4_200);

    let old = spawn_charge(&straggler, &key, &body);
    // The old generation has charged at the processor and is paused before recording it.
    for _ in 0..100 {
        if card_sim.charges_created().await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(card_sim.charges_created().await, 1);
    // Its record goes (as if reaped), and the key is claimed anew: attempt 1 again.
    sqlx::query("DELETE FROM idempotency_records")
        .execute(&db.pool)
        .await
        .expect("delete the record");
    let new = spawn_charge(&successor, &key, &body);

    // The straggler wakes while the new generation holds the key: it is fenced off and told
    // the key is in use; it wrote nothing.
    assert_eq!(old.await.expect("old task").0, 409);
    let (status, replayed, _) = new.await.expect("new task");
    assert_eq!((status, replayed), (201, false));
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
    let own_charge: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM charges c JOIN idempotency_records r ON c.id = r.resource_id",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count");
    assert_eq!(own_charge, 1, "the one charge is the new generation's own");
}

/// Sends a charge in the background; resolves to its status, whether it was a replay, and
/// its body.
fn spawn_charge(
    service: &Service,
    key: &str,
    body: &Value,
) -> tokio::task::JoinHandle<(u16, bool, Vec<u8>)> {
    let (url, key, body) = (service.url("/charges"), key.to_owned(), body.clone());
    tokio::spawn(async move {
        let response = http_client()
            .post(url)
            .bearer_auth(ACME)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await
            .expect("a charge");
        let replayed = response.headers().get("idempotent-replayed").is_some();
        (
            response.status().as_u16(),
            replayed,
            response.bytes().await.expect("body").to_vec(),
        )
    })
}

/// Waits (bounded) until the key's record is charged and its lock has expired.
async fn wait_for_stale_lock(db: &TestDatabase, key: &str) {
    for _ in 0..100 {
        let sql = format!(
            "SELECT count(*) FROM idempotency_records
             WHERE idempotency_key = $1 AND state = 'pending' AND locked_until < {}",
            db.now()
        );
        let stale: i64 = sqlx::query_scalar(&sql)
            .bind(key)
            .fetch_one(&db.pool)
            .await
            .expect("read record");
        if stale == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("attempt 1 never held a stale lock");
}

async fn a_duplicate_that_prefers_to_wait_gets_the_replay_instead_of_409(backend: Backend) {
    let card_sim = CardSim::start_with_latency_ms(1_000).await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[processor(&card_sim)]).await;
    let key = new_key();
    let body = visa(1500);

    let first = tokio::spawn({
        let (url, key, body) = (service.url("/charges"), key.clone(), body.clone());
        async move {
            let response = http_client()
                .post(url)
                .bearer_auth(ACME)
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .expect("first");
            (
                response.status().as_u16(),
                response.bytes().await.expect("body"),
            )
        }
    });
    // The duplicate is sent once the first attempt holds the record.
    while count_rows(&db.pool, "idempotency_records").await == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let impatient = service.post_charge(&key, &body).await;
    assert_eq!(
        impatient.status().as_u16(),
        409,
        "without Prefer: wait the duplicate is refused"
    );

    let patient = http_client()
        .post(service.url("/charges"))
        .bearer_auth(ACME)
        .header("Idempotency-Key", &key)
        .header("Prefer", "wait=5")
        .json(&body)
        .send()
        .await
        .expect("duplicate");
    assert_eq!(patient.status().as_u16(), 201);
    assert_eq!(patient.headers()["idempotent-replayed"], "true");
    let (status, first_body) = first.await.expect("first task");
    assert_eq!(status, 201);
    assert_eq!(patient.bytes().await.expect("body"), first_body);
    assert_eq!(card_sim.charges_created().await, 1);
}

async fn after_expiry_and_reaping_the_same_key_is_fresh_for_any_payload(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let mut env = TWO_SECOND_RETENTION.to_vec();
    env.push(("PAYMENTS__WORKERS__REAPER_INTERVAL_MS", "200"));
    let service = Service::start(&db.url, &env).await;
    let key = new_key();
    assert_eq!(
        service
            .post_charge(&key, &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
    let (status, _) = problem(service.post_charge(&key, &visa(200)).await).await;
    assert_eq!(status, 422, "within the TTL another payload is refused");

    for _ in 0..100 {
        if count_rows(&db.pool, "idempotency_records").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        count_rows(&db.pool, "idempotency_records").await,
        0,
        "the reaper deleted the expired record"
    );

    let fresh = service.post_charge(&key, &visa(200)).await;
    assert_eq!(fresh.status().as_u16(), 201);
    assert!(fresh.headers().get("idempotent-replayed").is_none());
    assert_eq!(count_rows(&db.pool, "charges").await, 2);
}

// PostgreSQL only: the embedded SQLite database is a file in the process, with no connection
// that could be cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_lost_requests_fail_closed_and_the_service_recovers_without_restart() {
    let card_sim = CardSim::start().await;
    let (db, relay, service) = charged_once_behind_a_relay(
        &card_sim,
        ("PAYMENTS__DATABASE__ACQUIRE_TIMEOUT_MS", "1000"),
    )
    .await;
    relay.cut().await;

    let key = new_key();
    for _ in 0..3 {
        let response = service.post_charge(&key, &visa(200)).await;
        let retry_after = response.headers().get("retry-after").is_some();
        let (status, body) = problem(response).await;
        assert!(retry_after, "503 carries Retry-After: {body}");
        assert_eq!(
            (status, body["code"].as_str()),
            (503, Some("store_unavailable"))
        );
    }
    let ready = http_client()
        .get(service.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status().as_u16(), 503);
    assert_eq!(
        card_sim.charges_created().await,
        1,
        "nothing is executed without a record"
    );

    relay.restore();
    let charge = charged_again_without_restart(&service, &key, 200).await;
    assert_eq!(charge["amount"], json!(200));
    assert_eq!(card_sim.charges_created().await, 2);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(2));
}

/// A fresh PostgreSQL database, a relay in front of it, and a service (its request timeout
/// 30 s, `setting` added) that reaches the database through the relay and has charged once,
/// so that a pooled connection is open.
async fn charged_once_behind_a_relay(
    card_sim: &CardSim,
    setting: (&'static str, &'static str),
) -> (TestDatabase, Relay, Service) {
    let db = TestDatabase::create(Backend::Postgres).await;
    let (relay, via_relay) = Relay::in_front_of(&db.url).await;
    let service = Service::start(
        &via_relay,
        &[
            processor(card_sim),
            ("PAYMENTS__SERVER__REQUEST_TIMEOUT_MS", "30000"),
            setting,
        ],
    )
    .await;
    let first = service.post_charge(&new_key(), &visa(100)).await;
    assert_eq!(first.status().as_u16(), 201);
    (db, relay, service)
}

/// Sends a charge of `amount` under `key` until it is charged (the first connections the
/// service tries may still be broken ones), and returns the charge.
async fn charged_again_without_restart(service: &Service, key: &str, amount: i64) -> Value {
    for _ in 0..50 {
        let response = service.post_charge(key, &visa(amount)).await;
        if response.status().as_u16() == 201 {
            return response.json::<Value>().await.expect("charge");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the service did not recover without a restart")
}

/// A frozen PostgreSQL (every byte held, as by a stopped process or a paused machine) never
/// runs its own `statement_timeout`, and its kernel keeps the connections open. The service
/// gives a statement up at its own bound, the timeout plus a second: the request gets 503
/// `store_unavailable` with `Retry-After`, not the 30 s request timeout, and nothing is charged.
/// The frozen node is then replaced (its connections cut, new ones reaching a database that
/// answers, as after a failover) and the same key is charged once, without a restart.
// PostgreSQL only, like the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_against_a_frozen_database_ends_at_the_statement_timeout_plus_a_margin() {
    let card_sim = CardSim::start().await;
    // The request timeout is 30 s, the statement timeout 1 s: the bound is 2 s.
    let (db, relay, service) = charged_once_behind_a_relay(
        &card_sim,
        ("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "1000"),
    )
    .await;

    relay.freeze();
    let key = new_key();
    let sent = std::time::Instant::now();
    let response = service.post_charge(&key, &visa(200)).await;
    let answered_after = sent.elapsed();
    let retry_after = response.headers().get("retry-after").is_some();
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("store_unavailable")),
        "{body}"
    );
    assert!(retry_after, "503 carries Retry-After: {body}");
    // The bound is 2 s; without it the request would wait for its own 30 s timeout.
    assert!(
        answered_after < Duration::from_secs(10),
        "answered after {answered_after:?}"
    );
    assert_eq!(card_sim.charges_created().await, 1, "nothing is charged");

    relay.cut().await;
    relay.restore();
    let charge = charged_again_without_restart(&service, &key, 200).await;
    assert_eq!(charge["amount"], json!(200));
    assert_eq!(card_sim.charges_created().await, 2);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(2));
}

/// The records in `state`.
async fn records_in(db: &TestDatabase, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE state = $1")
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .expect("count records")
}

/// A processor that answers later than the service waits (300 ms against a 100 ms timeout)
/// leaves 2,000 unknown outcomes that nobody retries: charges the processor made whose records
/// are pending. Two instances' completers settle the backlog, each settling several records
/// at once (`completer_settling` above 1), and every charge is recorded exactly once: as many
/// charges, ledger transactions and events as the processor made, each of their records
/// completed and every other failed. The processor makes all 2,000 unless the machine is so
/// busy that a call was not sent before its timeout: the completer then cancels its key at the
/// processor, which never makes it, and fails its record. The rate is printed for the notes,
/// not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_settle_a_backlog_of_unknown_outcomes_concurrently_and_each_once() {
    const BACKLOG: usize = 2_000;
    let card_sim = CardSim::start_with_latency_ms(300).await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let unlimited = "1000000";
    let common = [
        processor(&card_sim),
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "100"),
        ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "400"),
        ("PAYMENTS__AUTH__RATE_LIMIT_PER_SEC", unlimited),
        ("PAYMENTS__AUTH__RATE_LIMIT_BURST", unlimited),
    ];
    // The instance the clients reach never settles anything itself.
    let mut front = Service::start(
        &db.url,
        &[
            &common[..],
            &[("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "3600000")],
        ]
        .concat(),
    )
    .await;
    let body = visa(100);
    let statuses: Vec<u16> = stream::iter(0..BACKLOG)
        .map(|_| {
            let (front, body) = (&front, &body);
            async move { front.post_charge(&new_key(), body).await.status().as_u16() }
        })
        .buffer_unordered(100)
        .collect()
        .await;
    assert!(
        statuses.iter().all(|&status| status == 503),
        "every charge timed out"
    );
    front.kill().await;
    assert_eq!(count_rows(&db.pool, "charges").await, 0);

    let settling = [("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "200")];
    let completers = [
        Service::start(&db.url, &[&common[..], &settling[..]].concat()).await,
        Service::start(&db.url, &[&common[..], &settling[..]].concat()).await,
    ];
    let started = std::time::Instant::now();
    let mut most_at_once = 0.0_f64;
    for _ in 0..6_000 {
        for completer in &completers {
            let metrics = metrics_text(&completer.metrics_url).await;
            most_at_once = most_at_once.max(sample(&metrics, "completer_settling", &[]));
        }
        if records_in(&db, "pending").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    let made = card_sim.charges_created().await;
    assert!(
        made > BACKLOG as i64 / 2,
        "the processor made {made} of the {BACKLOG} charges"
    );
    assert_eq!(
        Footprint::of(&db.pool).await,
        Footprint {
            records: BACKLOG as i64,
            ..Footprint::charged(made)
        }
    );
    assert_eq!(
        (
            records_in(&db, "completed").await,
            records_in(&db, "failed").await,
            records_in(&db, "pending").await
        ),
        (made, BACKLOG as i64 - made, 0)
    );
    assert!(
        most_at_once >= 2.0,
        "the completers settled one record at a time"
    );
    eprintln!(
        "two completers settled {BACKLOG} unknown outcomes ({made} charges the processor made) \
         in {took:.1?} ({:.0} records/s), at most {most_at_once} at once on one instance",
        BACKLOG as f64 / took.as_secs_f64()
    );
}

on_every_backend!(
    three_instances_and_two_hundred_concurrent_duplicates_charge_once,
    a_slow_attempt_overtaken_by_its_successor_writes_nothing_and_answers_the_replay,
    a_resumed_attempt_overtaken_by_its_successor_writes_nothing_and_answers_the_replay,
    a_stale_writer_from_a_reaped_generation_writes_nothing,
    a_duplicate_that_prefers_to_wait_gets_the_replay_instead_of_409,
    after_expiry_and_reaping_the_same_key_is_fresh_for_any_payload,
);
