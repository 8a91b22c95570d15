//! Several instances, slow attempts overtaken by their successors, a lost database, waiting
//! duplicates and expiry: each against real processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::join_all;
use futures::stream::{self, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::AbortHandle;

use crate::card_sim::CardSim;
use crate::events::sample;
use crate::helpers::{
    ACME, Backend, Footprint, Service, TestDatabase, count_rows, http_client, metrics_text,
    new_key, problem, visa,
};

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

async fn a_slow_attempt_overtaken_by_its_successor_writes_nothing_and_answers_the_replay(
    backend: Backend,
) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let common = [
        processor(&card_sim),
        ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "1"),
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "800"),
        // The completer stays out of this race between two client attempts.
        ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "600000"),
    ];
    let mut slow_env = common.to_vec();
    slow_env.push(("PAYMENTS_PAUSE_AT", "after_charge:4000"));
    let slow = Service::start(&db.url, &slow_env).await;
    let fast = Service::start(&db.url, &common).await;
    let key = new_key();
    let body = visa(777);

    // Attempt 1 charges the card, then stalls past its lock.
    let first = spawn_charge(&slow, &key, &body);
    wait_for_stale_lock(&db, &key).await;

    // Attempt 2 takes the record over and finishes it.
    let second = fast.post_charge(&key, &body).await;
    assert_eq!(second.status().as_u16(), 201);
    assert!(
        second.headers().get("idempotent-replayed").is_none(),
        "attempt 2 executed"
    );
    let second_body = second.bytes().await.expect("body").to_vec();

    // Attempt 1 wakes: fenced off, it writes nothing and answers with the completed response.
    let (status, replayed, first_body) = first.await.expect("attempt 1 task");
    assert_eq!((status, replayed), (201, true));
    assert_eq!(first_body, second_body);
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM idempotency_records")
        .fetch_one(&db.pool)
        .await
        .expect("record");
    assert_eq!(attempts, 2);
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
    let service = Service::start(
        &db.url,
        &[
            ("PAYMENTS__IDEMPOTENCY__TTL_SECS", "2"),
            // The TTL must outlast the lock, and the processor timeout fit inside it.
            ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "1"),
            ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "500"),
            ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "600"),
            ("PAYMENTS__WORKERS__REAPER_INTERVAL_MS", "200"),
        ],
    )
    .await;
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

/// A TCP relay between the service and PostgreSQL that the test can cut and restore.
struct Relay {
    port: u16,
    open: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Relay {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let port = listener.local_addr().expect("relay address").port();
        let open = Arc::new(AtomicBool::new(true));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let (open, connections) = (open.clone(), connections.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused while cut
                    }
                    let upstream = upstream.clone();
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    connections.lock().await.push(task.abort_handle());
                }
            }
        })
        .abort_handle();
        Self {
            port,
            open,
            connections,
            accept,
        }
    }

    /// Severs every connection and refuses new ones.
    async fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for connection in self.connections.lock().await.drain(..) {
            connection.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

// PostgreSQL only: the embedded SQLite database is a file in the process, with no connection
// that could be cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_database_lost_requests_fail_closed_and_the_service_recovers_without_restart() {
    let backend = Backend::Postgres;
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let (host_port, path) = db
        .url
        .trim_start_matches("postgres://")
        .split_once('/')
        .map(|(a, p)| (a.to_owned(), p.to_owned()))
        .expect("url");
    let (user, upstream) = host_port
        .split_once('@')
        .map(|(u, h)| (u.to_owned(), h.to_owned()))
        .expect("user@host");
    let relay = Relay::start(upstream).await;
    let via_relay = format!("postgres://{user}@127.0.0.1:{}/{path}", relay.port);
    let service = Service::start(
        &via_relay,
        &[
            processor(&card_sim),
            ("PAYMENTS__DATABASE__ACQUIRE_TIMEOUT_MS", "1000"),
        ],
    )
    .await;

    assert_eq!(
        service
            .post_charge(&new_key(), &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
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
    let mut recovered = None;
    for _ in 0..50 {
        let response = service.post_charge(&key, &visa(200)).await;
        if response.status().as_u16() == 201 {
            recovered = Some(response.json::<Value>().await.expect("charge"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let charge = recovered.expect("the service recovered without a restart");
    assert_eq!(charge["amount"], json!(200));
    assert_eq!(card_sim.charges_created().await, 2);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(2));
}

/// A processor that answers later than the service waits (300 ms against a 100 ms timeout)
/// leaves 2,000 unknown outcomes that nobody retries: charges the processor made whose records
/// are pending. Two instances' completers settle the backlog, each settling several records
/// at once (`completer_settling` above 1), and every charge is recorded exactly once: 2,000 at
/// the processor, 2,000 charges, ledger transactions and events, every record completed. The
/// rate is printed for the notes, not asserted.
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
        if count_rows(&db.pool, "charges").await == BACKLOG as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    assert_eq!(
        Footprint::of(&db.pool).await,
        Footprint::charged(BACKLOG as i64)
    );
    assert_eq!(card_sim.charges_created().await, BACKLOG as i64);
    let completed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE state = 'completed'")
            .fetch_one(&db.pool)
            .await
            .expect("count completed records");
    assert_eq!(completed, BACKLOG as i64);
    assert!(
        most_at_once >= 2.0,
        "the completers settled one record at a time"
    );
    eprintln!(
        "two completers settled {BACKLOG} unknown outcomes in {took:.1?} ({:.0} records/s), \
         at most {most_at_once} at once on one instance",
        BACKLOG as f64 / took.as_secs_f64()
    );
}

on_every_backend!(
    three_instances_and_two_hundred_concurrent_duplicates_charge_once,
    a_slow_attempt_overtaken_by_its_successor_writes_nothing_and_answers_the_replay,
    a_stale_writer_from_a_reaped_generation_writes_nothing,
    a_duplicate_that_prefers_to_wait_gets_the_replay_instead_of_409,
    after_expiry_and_reaping_the_same_key_is_fresh_for_any_payload,
);
