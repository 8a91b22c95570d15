//! Each instance's recent answers: a retry that reaches the instance that answered is replayed
//! from its memory, byte for byte, without Redis or the database; another payload under the
//! key is still 422; a retry sent byte for byte as the request answered is replayed before it
//! is validated; the memory stays within its capacity; and an answer is never replayed after
//! its record expires.

use std::time::Duration;

use serde_json::json;
use sqlx::Executor;

use crate::events::{sample, scrape};
use crate::helpers::{
    ACME, Backend, Footprint, REPLAY_HEADERS, Service, TWO_SECOND_RETENTION, TestDatabase,
    assert_replays_first_answer, count_rows, new_key, problem, snapshot, spawn_app_with, visa,
};

/// `idempotency_outcomes_total` of `service` for each outcome named, in order.
async fn outcomes<const N: usize>(service: &Service, names: [&str; N]) -> [f64; N] {
    let metrics = scrape(service).await;
    names.map(|name| sample(&metrics, "idempotency_outcomes_total", &[("outcome", name)]))
}

async fn a_retry_is_replayed_from_memory_and_another_payload_is_still_422(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[]).await;
    let key = new_key();
    let first = service.post_charge(&key, &visa(100)).await;
    assert_eq!(first.status().as_u16(), 201);
    let first = first.bytes().await.expect("body");

    for _ in 0..3 {
        let replay = service.post_charge(&key, &visa(100)).await;
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.bytes().await.expect("body"), first);
    }
    let (status, body) = problem(service.post_charge(&key, &visa(101)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );

    assert_eq!(
        outcomes(
            &service,
            [
                "replayed_memory",
                "replayed_cache",
                "replayed_db",
                "mismatch"
            ]
        )
        .await,
        [3.0, 0.0, 0.0, 1.0],
        "every replay and the mismatch answered from memory"
    );
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

/// A refund is validated by reading its charge. A retry sent byte for byte as the refund
/// answered (the same path, the same body) was validated when it was first sent, and is
/// replayed from memory before it is parsed, validated or fingerprinted: even while the charges
/// cannot be read. The same refund spelled otherwise is still the same request, but it is
/// validated again first, so it waits for the charges, and is replayed once they can be read:
/// from then on, its bytes are replayed at once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_sent_byte_for_byte_is_replayed_before_it_is_validated() {
    let app = spawn_app_with(
        Backend::Postgres,
        &[("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "300")],
    )
    .await;
    let charge = app.charged(5_000, "tok_visa").await;
    let key = new_key();
    let body = json!({ "amount": 1_200, "reason": "requested_by_customer" });
    let first = app.post_refund(ACME, &charge, &key, &body).await;
    let (status, headers, bytes) = snapshot(first, &REPLAY_HEADERS).await;
    assert_eq!(status, 201);

    let mut blocker = app.lock_table("charges").await;

    let retry = app.post_refund(ACME, &charge, &key, &body).await;
    assert_replays_first_answer(retry, &headers, &bytes).await;

    let respelled = r#"{ "reason": "requested_by_customer", "amount": 1200 }"#;
    let send_respelled = || {
        app.client
            .post(app.url(&format!("/charges/{charge}/refunds")))
            .bearer_auth(ACME)
            .header("Idempotency-Key", &key)
            .header("Content-Type", "application/json")
            .body(respelled)
            .send()
    };
    let (status, problem) = problem(send_respelled().await.expect("send")).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (503, Some("store_unavailable")),
        "the respelled refund waits for its charge's read"
    );

    blocker.execute("ROLLBACK").await.expect("unlock");
    let respelled_retry = send_respelled().await.expect("send");
    assert_replays_first_answer(respelled_retry, &headers, &bytes).await;

    // Judged the same once, the respelled bytes are replayed before they are validated too.
    let mut blocker = app.lock_table("charges").await;
    let respelled_again = send_respelled().await.expect("send");
    assert_replays_first_answer(respelled_again, &headers, &bytes).await;
    blocker.execute("ROLLBACK").await.expect("unlock");
    assert_eq!(count_rows(app.db(), "refunds").await, 1, "one refund");
}

/// An answer another instance gave comes from the cache once, and from memory after.
async fn an_answer_from_another_instance_is_held_once_replayed(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let answering = Service::start(&db.url, &[]).await;
    let other = Service::start(&db.url, &[]).await;
    let key = new_key();
    assert_eq!(answering.post_charge(&key, &visa(100)).await.status(), 201);

    for _ in 0..3 {
        let replay = other.post_charge(&key, &visa(100)).await;
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(
        outcomes(&other, ["replayed_cache", "replayed_memory", "replayed_db"]).await,
        [1.0, 2.0, 0.0]
    );
}

/// However many keys are answered, the memory held stays within its capacity: the oldest
/// answers go, and their keys are replayed from the cache instead.
async fn the_memory_held_stays_within_its_capacity(backend: Backend) {
    const CAPACITY: f64 = 4096.0;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(
        &db.url,
        &[("PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES", "4096")],
    )
    .await;
    let keys: Vec<String> = (0..20).map(|_| new_key()).collect();
    for key in &keys {
        assert_eq!(service.post_charge(key, &visa(100)).await.status(), 201);
        let held = sample(&scrape(&service).await, "recent_answers_bytes", &[]);
        assert!(held > 0.0 && held <= CAPACITY, "{held} bytes held");
    }
    let entries = sample(&scrape(&service).await, "recent_answers", &[]);
    assert!(
        (1.0..20.0).contains(&entries),
        "only what fits is held: {entries} answers"
    );

    let newest = keys.last().expect("a key");
    assert_eq!(service.post_charge(newest, &visa(100)).await.status(), 201);
    assert_eq!(
        service.post_charge(&keys[0], &visa(100)).await.status(),
        201
    );
    assert_eq!(
        outcomes(&service, ["replayed_memory", "replayed_cache"]).await,
        [1.0, 1.0],
        "the newest answer from memory, the oldest from the cache"
    );
}

/// Without Redis, memory is all that stands before the records: once the record expires, the
/// same request under the key is a new charge, never the old answer.
async fn an_answer_is_never_replayed_from_memory_after_its_record_expires(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    // Expired records stay in place, to be replaced by the next claim.
    let mut env = TWO_SECOND_RETENTION.to_vec();
    env.extend([
        ("PAYMENTS__REDIS__URL", ""),
        ("PAYMENTS__WORKERS__REAPER_INTERVAL_MS", "600000"),
    ]);
    let service = Service::start(&db.url, &env).await;
    let key = new_key();
    assert_eq!(service.post_charge(&key, &visa(100)).await.status(), 201);
    let replay = service.post_charge(&key, &visa(100)).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(outcomes(&service, ["replayed_memory"]).await, [1.0]);

    // Past the record's expiry (two seconds after its completion).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let fresh = service.post_charge(&key, &visa(100)).await;
    assert_eq!(fresh.status().as_u16(), 201);
    assert!(
        fresh.headers().get("idempotent-replayed").is_none(),
        "a new charge, not the expired answer"
    );
    let footprint = Footprint::of(&db.pool).await;
    assert_eq!(
        (
            footprint.records,
            footprint.charges,
            footprint.ledger_transactions,
            footprint.outbox_events
        ),
        (1, 2, 2, 2),
        "the key's record replaced, and a second charge"
    );
}

on_every_backend!(
    a_retry_is_replayed_from_memory_and_another_payload_is_still_422,
    an_answer_from_another_instance_is_held_once_replayed,
    the_memory_held_stays_within_its_capacity,
    an_answer_is_never_replayed_from_memory_after_its_record_expires,
);
