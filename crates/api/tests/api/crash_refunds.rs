//! The crash matrix of a refund: the service is aborted after the claim (and the reservation
//! of the amount), after the refund at the processor, or after the commit, restarted on the same database against the same
//! card-sim process, and the client then never retries, or retries only after the lock
//! timeout. In every cell: exactly one refund at the processor (none when the crash came
//! before the processor call and nobody retried), one succeeded refund row, one reversing
//! ledger transaction and one `payment.refunded` event per refund, the charge's refunded and
//! reserved amounts equal to it, and every later retry replays one and the same response.

use std::time::Duration;

use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::crash::{
    Client, concurrent_rounds_until_aborted, crash_env, each_retried_until_created, post_to,
    post_until_final_to, settings, start, wait_until_settled,
};
use crate::helpers::{Backend, TestDatabase, count_rows, new_key, visa};

const AMOUNT: i64 = 1_500;

/// What refunds left behind: processor refunds, refund rows, ledger transactions after the
/// charge's, `payment.refunded` events, and the charge's refunded and reserved amounts. A
/// reservation whose refund never happened shows as a reserved amount above the refunded one.
async fn refund_footprint(db: &TestDatabase, card_sim: &CardSim) -> [i64; 6] {
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE event_type = 'payment.refunded'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("count events");
    let (refunded, reserved): (i64, i64) =
        sqlx::query_as("SELECT amount_refunded, amount_reserved FROM charges")
            .fetch_one(&db.pool)
            .await
            .expect("the charge");
    [
        card_sim.refunds_created().await,
        count_rows(&db.pool, "refunds").await,
        count_rows(&db.pool, "ledger_transactions").await - 1,
        events,
        refunded,
        reserved,
    ]
}

/// The id of a charge of `amount`, made by a service started for it and stopped.
async fn charged(db: &TestDatabase, settings: &[(&'static str, String)], amount: i64) -> String {
    let service = start(db, settings, &[]).await;
    let response = post_to(&service, "/charges", &new_key(), &visa(amount))
        .await
        .expect("charge");
    assert_eq!(response.status().as_u16(), 201);
    let charge: Value = response.json().await.expect("charge");
    charge["id"].as_str().expect("id").to_owned()
}

fn refunded(n: i64) -> [i64; 6] {
    [n, n, n, n, n * AMOUNT, n * AMOUNT]
}

async fn refund_crash_then(backend: Backend, point: &str, client: Client) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let charge = charged(&db, &settings, 5_000).await;
    let path = format!("/charges/{charge}/refunds");
    let key = new_key();
    let body = json!({ "amount": AMOUNT });

    let mut crashing = start(&db, &settings, &crash_env(point)).await;
    assert!(
        post_to(&crashing, &path, &key, &body).await.is_err(),
        "the service dies before it answers"
    );
    assert!(!crashing.wait_exit().await, "the service was aborted");

    let service = start(&db, &settings, &[]).await;
    let first_answer = match client {
        Client::RetriesAfterLockTimeout => {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            let response = post_to(&service, &path, &key, &body).await.expect("answer");
            assert_eq!(response.status().as_u16(), 201);
            Some(response.bytes().await.expect("body").to_vec())
        }
        Client::NeverRetries => {
            let refunded_before_crash = point != "after_claim";
            let expected = if refunded_before_crash {
                "completed"
            } else {
                "failed"
            };
            assert_eq!(wait_until_settled(&db, &key).await, expected);
            None
        }
        Client::RetriesAtOnce => unreachable!("not a cell of the refund matrix"),
    };

    let expected = if point == "after_claim" && client == Client::NeverRetries {
        0
    } else {
        1
    };
    assert_eq!(refund_footprint(&db, &card_sim).await, refunded(expected));

    // Every later retry replays one and the same response (after a failed record, the first
    // of them executes it under a new processor key: still one refund).
    let (status, later) = post_until_final_to(&service, &path, &key, &body).await;
    assert_eq!(status, 201);
    for _ in 0..2 {
        let replay = post_to(&service, &path, &key, &body).await.expect("replay");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.bytes().await.expect("body").to_vec(), later);
    }
    if let Some(first) = first_answer {
        assert_eq!(
            first, later,
            "the client's first answer is the one replayed"
        );
    }
    assert_eq!(refund_footprint(&db, &card_sim).await, refunded(1));
}

async fn refund_crash_after_claim_then_client_never_retries(backend: Backend) {
    refund_crash_then(backend, "after_claim", Client::NeverRetries).await;
}

async fn refund_crash_after_claim_then_client_retries_late(backend: Backend) {
    refund_crash_then(backend, "after_claim", Client::RetriesAfterLockTimeout).await;
}

// `after_charge` is the point after the effect, whatever the operation's effect is.
async fn refund_crash_after_effect_then_client_never_retries(backend: Backend) {
    refund_crash_then(backend, "after_charge", Client::NeverRetries).await;
}

async fn refund_crash_after_effect_then_client_retries_late(backend: Backend) {
    refund_crash_then(backend, "after_charge", Client::RetriesAfterLockTimeout).await;
}

async fn refund_crash_after_commit_then_client_never_retries(backend: Backend) {
    refund_crash_then(backend, "after_commit", Client::NeverRetries).await;
}

async fn refund_crash_after_commit_then_client_retries_late(backend: Backend) {
    refund_crash_then(backend, "after_commit", Client::RetriesAfterLockTimeout).await;
}

/// The service is aborted on PostgreSQL inside a batch of at least two refunds' finishes (of
/// one charge), their records completed and their refunds, ledger transactions and events
/// written in the batch's transaction, before its commit. Restarted, every refund, retried
/// under its key, ends with exactly one refund at the processor, one succeeded refund row, one
/// ledger transaction and one event, and the charge's refunded and reserved amounts are their
/// sum: the batch wrote nothing, and its refunds are finished from their effect keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_inside_a_batch_of_refunds_loses_no_refund_and_doubles_none() {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let settings = settings(&card_sim);
    // Enough for every refund of twenty rounds of eight.
    let charge = charged(&db, &settings, 160 * AMOUNT).await;
    let path = format!("/charges/{charge}/refunds");
    let body = json!({ "amount": AMOUNT });
    let sent = {
        let mut crashing = start(&db, &settings, &crash_env("in_batch_of_finishes")).await;
        concurrent_rounds_until_aborted(&db, &mut crashing, &path, &body).await
    };
    let service = start(&db, &settings, &[]).await;
    each_retried_until_created(&service, &path, &sent, &body).await;
    assert_eq!(
        refund_footprint(&db, &card_sim).await,
        refunded(sent.len() as i64)
    );
}

on_every_backend!(
    refund_crash_after_claim_then_client_never_retries,
    refund_crash_after_claim_then_client_retries_late,
    refund_crash_after_effect_then_client_never_retries,
    refund_crash_after_effect_then_client_retries_late,
    refund_crash_after_commit_then_client_never_retries,
    refund_crash_after_commit_then_client_retries_late,
);
