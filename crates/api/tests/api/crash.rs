//! The crash matrix: the service is aborted (no unwinding, no cleanup) at each point of a
//! `POST /charges`, restarted on the same database against the same card-sim process, and the
//! client then retries at once, retries after the lock timeout, or never retries. In every cell:
//! exactly one charge at the processor (none when the crash came before the charge and nobody
//! retried), one ledger transaction and one outbox event per charge, and every later retry
//! replays one and the same response.

use std::time::Duration;

use futures::future::join_all;
use reqwest::Response;
use serde_json::Value;

use crate::card_sim::CardSim;
use crate::helpers::{ACME, Backend, Footprint, Service, TestDatabase, http_client, new_key, visa};

/// Short locks keep the matrix fast; the processor timeout must stay below the lock.
const LOCK_TIMEOUT_SECS: &str = "2";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    RetriesAtOnce,
    RetriesAfterLockTimeout,
    NeverRetries,
}

pub(crate) fn settings(card_sim: &CardSim) -> Vec<(&'static str, String)> {
    vec![
        ("PAYMENTS__PROCESSOR__URL", card_sim.url.clone()),
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "1500".into()),
        ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "1600".into()),
        (
            "PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS",
            LOCK_TIMEOUT_SECS.into(),
        ),
        ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "200".into()),
    ]
}

pub(crate) async fn start(
    db: &TestDatabase,
    settings: &[(&'static str, String)],
    extra: &[(&'static str, &str)],
) -> Service {
    start_program(env!("CARGO_BIN_EXE_payments-api"), db, settings, extra).await
}

/// [`start`] with another build of the service: the program at `program`.
pub(crate) async fn start_program(
    program: impl AsRef<std::ffi::OsStr>,
    db: &TestDatabase,
    settings: &[(&'static str, String)],
    extra: &[(&'static str, &str)],
) -> Service {
    let mut env: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(extra);
    Service::start_program(program, &db.url, &env).await
}

async fn post(service: &Service, key: &str, body: &Value) -> reqwest::Result<Response> {
    post_to(service, "/charges", key, body).await
}

/// A POST to `path` as tenant acme under `key`.
pub(crate) async fn post_to(
    service: &Service,
    path: &str,
    key: &str,
    body: &Value,
) -> reqwest::Result<Response> {
    http_client()
        .post(service.url(path))
        .bearer_auth(ACME)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
}

/// Retries as a well-behaved client does: on 409, waits the Retry-After it was given.
async fn post_until_final(service: &Service, key: &str, body: &Value) -> (u16, Vec<u8>) {
    post_until_final_to(service, "/charges", key, body).await
}

/// [`post_until_final`] to `path`.
pub(crate) async fn post_until_final_to(
    service: &Service,
    path: &str,
    key: &str,
    body: &Value,
) -> (u16, Vec<u8>) {
    for _ in 0..20 {
        let response = post_to(service, path, key, body)
            .await
            .expect("the restarted service answers");
        if response.status().as_u16() == 409 {
            let secs = response.headers()["retry-after"]
                .to_str()
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(secs)).await;
            continue;
        }
        let status = response.status().as_u16();
        return (status, response.bytes().await.expect("body").to_vec());
    }
    panic!("the key never reached a final answer");
}

/// The record's processor key.
async fn processor_key(db: &TestDatabase, key: &str) -> String {
    sqlx::query_scalar("SELECT processor_key FROM idempotency_records WHERE idempotency_key = $1")
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .expect("read record")
}

/// Leaves `key` failed: the service dies after the claim, before the processor call; the
/// completer of a restarted service cancels the processor key and fails the record.
async fn fail_by_cancel(
    db: &TestDatabase,
    settings: &[(&'static str, String)],
    key: &str,
    body: &Value,
) -> (Service, String) {
    let mut crashing = start(db, settings, &[("PAYMENTS_CRASH_AT", "after_claim")]).await;
    assert!(post(&crashing, key, body).await.is_err());
    assert!(!crashing.wait_exit().await);
    let old_processor_key = processor_key(db, key).await;
    let service = start(db, settings, &[]).await;
    assert_eq!(wait_until_settled(db, key).await, "failed");
    (service, old_processor_key)
}

async fn a_call_that_never_reached_the_processor_is_canceled_and_retried_under_a_new_processor_key(
    backend: Backend,
) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let key = new_key();
    let body = visa(2_222);
    let (service, old_processor_key) = fail_by_cancel(&db, &settings, &key, &body).await;

    // The processor tombstoned the old key: nothing can ever be charged under it.
    let late = http_client()
        .post(format!("{}/v1/charges", card_sim.url))
        .header("Idempotency-Key", &old_processor_key)
        .json(&serde_json::json!({ "amount": 2_222, "currency": "USD", "source": "tok_visa" }))
        .send()
        .await
        .expect("card-sim");
    assert_eq!(late.status().as_u16(), 409);
    let late: Value = late.json().await.expect("card-sim error");
    assert_eq!(late["error"]["code"], "idempotency_key_canceled");
    assert_eq!(card_sim.charges_created().await, 0);

    // The client's retry charges exactly once, under a new processor key.
    let (status, first) = post_until_final(&service, &key, &body).await;
    assert_eq!(status, 201);
    assert_ne!(processor_key(&db, &key).await, old_processor_key);
    let (_, again) = post_until_final(&service, &key, &body).await;
    assert_eq!(again, first);
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

/// Retention counts from the completion: a failed record retried half a second before its
/// TTL ends completes with a whole TTL ahead, so the next retry replays it instead of
/// treating the key as fresh and charging again.
async fn a_failed_record_resumed_just_before_its_ttl_ends_completes_and_replays(backend: Backend) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let key = new_key();
    let body = visa(3_333);
    let (service, _) = fail_by_cancel(&db, &settings, &key, &body).await;

    let soon = match db.backend {
        Backend::Postgres => "now() + interval '500 milliseconds'",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+0.5 seconds')",
    };
    sqlx::query(&format!(
        "UPDATE idempotency_records SET expires_at = {soon} WHERE idempotency_key = $1"
    ))
    .bind(&key)
    .execute(&db.pool)
    .await
    .expect("move the expiry close");
    let (status, first) = post_until_final(&service, &key, &body).await;
    assert_eq!(status, 201);

    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let replay = post(&service, &key, &body).await.expect("replay");
    assert_eq!(replay.status().as_u16(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body").to_vec(), first);
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

/// The completer settles a record with the operation it was claimed for. A record of an
/// operation this build does not know (written by a newer version, say) may hold an effect
/// this build cannot check, so it is taken over and released again, round after round, and
/// never failed.
async fn a_record_of_an_operation_this_build_does_not_know_is_never_failed(backend: Backend) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let key = new_key();
    let mut crashing = start(&db, &settings, &[("PAYMENTS_CRASH_AT", "after_claim")]).await;
    assert!(post(&crashing, &key, &visa(5_555)).await.is_err());
    assert!(!crashing.wait_exit().await);
    sqlx::query(
        "UPDATE idempotency_records SET operation = 'subscriptions.create'
         WHERE idempotency_key = $1",
    )
    .bind(&key)
    .execute(&db.pool)
    .await
    .expect("move the record to another operation");

    let _service = start(&db, &settings, &[]).await;
    // Each round of the completer takes the record over (attempts + 1) and releases it.
    let mut attempts = 1;
    for _ in 0..100 {
        attempts = sqlx::query_scalar::<_, i32>(
            "SELECT attempts FROM idempotency_records WHERE idempotency_key = $1",
        )
        .bind(&key)
        .fetch_one(&db.pool)
        .await
        .expect("read record");
        if attempts >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        attempts >= 3,
        "the completer took the record over {attempts} times"
    );
    let state: String =
        sqlx::query_scalar("SELECT state FROM idempotency_records WHERE idempotency_key = $1")
            .bind(&key)
            .fetch_one(&db.pool)
            .await
            .expect("read record");
    assert_eq!(state, "pending");
    assert_eq!(card_sim.charges_created().await, 0);
}

/// The state of `key`'s record, if it has one.
pub(crate) async fn record_state(db: &TestDatabase, key: &str) -> Option<String> {
    sqlx::query_scalar("SELECT state FROM idempotency_records WHERE idempotency_key = $1")
        .bind(key)
        .fetch_optional(&db.pool)
        .await
        .expect("read record")
}

/// Waits (bounded) until the completer has settled the record (no longer pending).
pub(crate) async fn wait_until_settled(db: &TestDatabase, key: &str) -> String {
    for _ in 0..100 {
        match record_state(db, key).await.as_deref() {
            Some("pending") | None => tokio::time::sleep(Duration::from_millis(100)).await,
            Some(state) => return state.to_owned(),
        }
    }
    panic!("the completer did not settle the abandoned record");
}

/// The variables that crash a service at `point`. A first charge writes `charged` only when
/// its finish fails, so reaching `after_charged` takes a finish made to fail.
pub(crate) fn crash_env(point: &str) -> Vec<(&'static str, &str)> {
    let mut env = vec![("PAYMENTS_CRASH_AT", point)];
    if point == "after_charged" {
        env.push(("PAYMENTS_FAIL_AT", "finish"));
    }
    env
}

/// The record's recovery point, and whether it holds a processor charge id.
async fn recovery_point(db: &TestDatabase, key: &str) -> (String, bool) {
    let (point, charge_id): (String, Option<String>) = sqlx::query_as(
        "SELECT recovery_point, effect_id FROM idempotency_records
         WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .expect("read record");
    (point, charge_id.is_some())
}

async fn crash_then(backend: Backend, point: &str, client: Client) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let key = new_key();
    let body = visa(4321);

    let mut crashing = start(&db, &settings, &crash_env(point)).await;
    assert!(
        post(&crashing, &key, &body).await.is_err(),
        "the service dies before it answers"
    );
    assert!(
        !crashing.wait_exit().await,
        "the service was aborted, not shut down"
    );
    if point == "after_charged" {
        assert_eq!(
            recovery_point(&db, &key).await,
            ("charged".to_owned(), true),
            "the failed finish left the processor's charge id behind"
        );
    }

    let service = start(&db, &settings, &[]).await;
    let first_answer = match client {
        Client::RetriesAtOnce => Some(post_until_final(&service, &key, &body).await),
        Client::RetriesAfterLockTimeout => {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            let response = post(&service, &key, &body).await.expect("answer");
            assert_eq!(
                response.status().as_u16(),
                201,
                "after the lock timeout the retry is not refused"
            );
            Some((201, response.bytes().await.expect("body").to_vec()))
        }
        Client::NeverRetries => {
            let settled = wait_until_settled(&db, &key).await;
            let charged_before_crash = point != "after_claim";
            assert_eq!(
                settled,
                if charged_before_crash {
                    "completed"
                } else {
                    "failed"
                }
            );
            None
        }
    };

    let expected = if point == "after_claim" && client == Client::NeverRetries {
        0
    } else {
        1
    };
    assert_eq!(
        card_sim.charges_created().await,
        expected,
        "charges at the processor"
    );
    let footprint = Footprint::of(&db.pool).await;
    assert_eq!(
        (
            footprint.charges,
            footprint.ledger_transactions,
            footprint.outbox_events
        ),
        (expected, expected, expected)
    );
    if let Some((status, _)) = &first_answer {
        assert_eq!(*status, 201);
    }

    // Every later retry replays one and the same response (after a failed record, the first
    // of them executes it: with the same processor key, so still one charge).
    let (status, later) = post_until_final(&service, &key, &body).await;
    assert_eq!(status, 201);
    for _ in 0..2 {
        let replay = post(&service, &key, &body).await.expect("replay");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.bytes().await.expect("body").to_vec(), later);
    }
    if let Some((_, first)) = first_answer {
        assert_eq!(
            first, later,
            "the client's first answer is the one replayed"
        );
    }
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

async fn crash_after_claim_then_client_retries_at_once(backend: Backend) {
    crash_then(backend, "after_claim", Client::RetriesAtOnce).await;
}

async fn crash_after_claim_then_client_retries_after_lock_timeout(backend: Backend) {
    crash_then(backend, "after_claim", Client::RetriesAfterLockTimeout).await;
}

async fn crash_after_claim_then_client_never_retries(backend: Backend) {
    crash_then(backend, "after_claim", Client::NeverRetries).await;
}

async fn crash_after_charge_then_client_retries_at_once(backend: Backend) {
    crash_then(backend, "after_charge", Client::RetriesAtOnce).await;
}

async fn crash_after_charge_then_client_retries_after_lock_timeout(backend: Backend) {
    crash_then(backend, "after_charge", Client::RetriesAfterLockTimeout).await;
}

async fn crash_after_charge_then_client_never_retries(backend: Backend) {
    crash_then(backend, "after_charge", Client::NeverRetries).await;
}

async fn crash_after_charged_then_client_retries_at_once(backend: Backend) {
    crash_then(backend, "after_charged", Client::RetriesAtOnce).await;
}

async fn crash_after_charged_then_client_retries_after_lock_timeout(backend: Backend) {
    crash_then(backend, "after_charged", Client::RetriesAfterLockTimeout).await;
}

async fn crash_after_charged_then_client_never_retries(backend: Backend) {
    crash_then(backend, "after_charged", Client::NeverRetries).await;
}

async fn crash_after_commit_then_client_retries_at_once(backend: Backend) {
    crash_then(backend, "after_commit", Client::RetriesAtOnce).await;
}

async fn crash_after_commit_then_client_retries_after_lock_timeout(backend: Backend) {
    crash_then(backend, "after_commit", Client::RetriesAfterLockTimeout).await;
}

async fn crash_after_commit_then_client_never_retries(backend: Backend) {
    crash_then(backend, "after_commit", Client::NeverRetries).await;
}

/// A finish that fails after the processor charged leaves the charge's id on the record and
/// lets go of the key before it answers 503: the retry the 503 asks for, sent at once (here to
/// another instance), completes the record from that id (201, still one charge), and is never
/// told the key is in use until the lock runs out.
async fn a_failed_finish_lets_go_of_the_key_so_a_retry_at_once_completes_it(backend: Backend) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let key = new_key();
    let body = visa(4321);
    let failing = start(&db, &settings, &[("PAYMENTS_FAIL_AT", "finish")]).await;
    let healthy = start(&db, &settings, &[]).await;

    let first = post(&failing, &key, &body).await.expect("answer");
    assert_eq!(first.status().as_u16(), 503, "the finish failed");
    assert_eq!(
        recovery_point(&db, &key).await,
        ("charged".to_owned(), true),
        "the failed finish left the processor's charge id behind"
    );

    let retry = post(&healthy, &key, &body).await.expect("answer");
    assert_eq!(
        retry.status().as_u16(),
        201,
        "the retry at once completes the record instead of meeting its lock"
    );
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

/// The service is aborted inside a group commit on SQLite, once at least two requests'
/// charges and their records' ends are written in the batch's transaction and none is
/// committed. Rounds of eight concurrent charges are sent until the abort comes (their finishes
/// meet at the gate, having claimed and charged together). Restarted, every request of every
/// round, retried under its key, ends with exactly one charge at the processor, one ledger
/// transaction and one event: the batch's requests were either committed together or are
/// resumed from their effect keys, never charged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_inside_a_group_commit_loses_no_charge_and_doubles_none() {
    kill_in_a_group_commit(Backend::Sqlite, "in_group_commit").await;
}

/// The service is aborted on PostgreSQL once one statement has claimed at least two fresh keys
/// together, before any of their requests hears it: their records are pending, locked, and
/// nothing was charged. Restarted, every request, retried under its key, ends with exactly one
/// charge, ledger transaction and event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_after_a_statement_of_claims_loses_no_charge_and_doubles_none() {
    kill_in_a_group_commit(Backend::Postgres, "after_group_commit_of_claims").await;
}

/// The service is aborted on PostgreSQL inside a batch of at least two charges' finishes,
/// their records completed and their rows written in the batch's transaction, before its
/// commit. Restarted, every request, retried under its key, ends with exactly one charge,
/// ledger transaction and event: the batch wrote nothing, and its charges are finished from
/// their effect keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_inside_a_batch_of_finishes_loses_no_charge_and_doubles_none() {
    kill_in_a_group_commit(Backend::Postgres, "in_batch_of_finishes").await;
}

/// Rounds of concurrent charges until `failpoint` aborts the service, then every key retried
/// after a restart: what was answered is committed, and each key has exactly one effect.
async fn kill_in_a_group_commit(backend: Backend, failpoint: &str) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let body = visa(4321);
    let sent = {
        let crash = [("PAYMENTS_CRASH_AT", failpoint)];
        let mut crashing = start(&db, &settings, &crash).await;
        concurrent_rounds_until_aborted(&db, &mut crashing, "/charges", &body).await
    };
    let service = start(&db, &settings, &[]).await;
    each_retried_until_created(&service, "/charges", &sent, &body).await;
    let sent = sent.len() as i64;
    assert_eq!(
        card_sim.charges_created().await,
        sent,
        "charges at the processor"
    );
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(sent));
}

/// Retries each of `keys` with `body` to `path` until its answer is final, which must be 201:
/// every request is made, after a restart if not before.
pub(crate) async fn each_retried_until_created(
    service: &Service,
    path: &str,
    keys: &[String],
    body: &Value,
) {
    for key in keys {
        let (status, _) = post_until_final_to(service, path, key, body).await;
        assert_eq!(status, 201, "{key} to {path}, retried until final");
    }
}

/// Sends `crashing` rounds of eight concurrent POSTs of `body` to `path`, each under a new key,
/// until a round is cut short by the abort its failpoint waits for (at most twenty rounds),
/// and checks that every request answered 201 before the abort has its record completed: an
/// answer is given only once its batch is committed. Returns every key sent.
pub(crate) async fn concurrent_rounds_until_aborted(
    db: &TestDatabase,
    crashing: &mut Service,
    path: &str,
    body: &Value,
) -> Vec<String> {
    const ROUNDS: usize = 20;
    const CONCURRENT: usize = 8;
    let mut sent = Vec::new();
    let mut answered = Vec::new();
    let mut cut_short = false;
    for _ in 0..ROUNDS {
        let keys: Vec<String> = (0..CONCURRENT).map(|_| new_key()).collect();
        let answers = join_all(keys.iter().map(|key| post_to(crashing, path, key, body))).await;
        for (key, answer) in keys.iter().zip(&answers) {
            match answer {
                Ok(answer) if answer.status().as_u16() == 201 => answered.push(key.clone()),
                Ok(answer) => panic!("{key} was answered {}", answer.status()),
                Err(_) => cut_short = true,
            }
        }
        sent.extend(keys);
        if cut_short {
            break;
        }
    }
    assert!(
        cut_short,
        "{ROUNDS} rounds of {CONCURRENT} concurrent requests to {path} never met in one group commit"
    );
    assert!(
        !crashing.wait_exit().await,
        "the service was aborted, not shut down"
    );
    for key in &answered {
        assert_eq!(
            record_state(db, key).await.as_deref(),
            Some("completed"),
            "{key} was answered 201 before the abort"
        );
    }
    sent
}

on_every_backend!(
    a_failed_finish_lets_go_of_the_key_so_a_retry_at_once_completes_it,
    crash_after_claim_then_client_retries_at_once,
    crash_after_claim_then_client_retries_after_lock_timeout,
    crash_after_claim_then_client_never_retries,
    crash_after_charge_then_client_retries_at_once,
    crash_after_charge_then_client_retries_after_lock_timeout,
    crash_after_charge_then_client_never_retries,
    crash_after_charged_then_client_retries_at_once,
    crash_after_charged_then_client_retries_after_lock_timeout,
    crash_after_charged_then_client_never_retries,
    crash_after_commit_then_client_retries_at_once,
    crash_after_commit_then_client_retries_after_lock_timeout,
    crash_after_commit_then_client_never_retries,
    a_call_that_never_reached_the_processor_is_canceled_and_retried_under_a_new_processor_key,
    a_failed_record_resumed_just_before_its_ttl_ends_completes_and_replays,
    a_record_of_an_operation_this_build_does_not_know_is_never_failed,
);
