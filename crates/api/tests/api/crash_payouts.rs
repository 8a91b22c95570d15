//! The crash matrix of a payout: the service is aborted after the claim (and the reservation
//! of the amount on the balance), after the payout at the processor, or after the commit,
//! restarted on the same database against the same card-sim process, and the client then
//! never retries, or retries only after the lock timeout. In every cell: exactly one payout at
//! the processor (none when the crash came before the processor call and nobody retried), one
//! paid payout row, one payout ledger transaction and one `payout.paid` event per payout, no
//! reservation left pending, the balance less exactly what was paid out, and every later retry
//! replays one and the same response.

use std::time::Duration;

use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::crash::{
    Client, concurrent_rounds_until_aborted, crash_env, each_retried_until_created, post_to,
    post_until_final_to, settings, start, wait_until_settled,
};
use crate::helpers::{ACME, Backend, Service, TestDatabase, http_client, new_key, payout, visa};

const FUNDS: i64 = 5_000;
const AMOUNT: i64 = 1_500;

/// Rows of `table` that meet `condition`.
async fn count_where(db: &TestDatabase, table: &str, condition: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table} WHERE {condition}"))
        .fetch_one(&db.pool)
        .await
        .expect("count rows")
}

/// What payouts left behind: processor payouts, paid payout rows, ledger transactions of a
/// payout, `payout.paid` events, and payout rows still pending. A reservation whose payout
/// never happened, or was never recorded, shows as a pending row.
async fn payout_footprint(db: &TestDatabase, card_sim: &CardSim) -> [i64; 5] {
    [
        card_sim.payouts_created().await,
        count_where(db, "payouts", "status = 'paid'").await,
        count_where(db, "ledger_transactions", "payout_id IS NOT NULL").await,
        count_where(db, "outbox_events", "event_type = 'payout.paid'").await,
        count_where(db, "payouts", "status = 'pending'").await,
    ]
}

fn paid_out(n: i64) -> [i64; 5] {
    [n, n, n, n, 0]
}

/// The tenant's balance as `GET /balance` shows it.
async fn balance(service: &Service) -> Value {
    let response = http_client()
        .get(service.url("/balance"))
        .bearer_auth(ACME)
        .send()
        .await
        .expect("GET /balance");
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.expect("balance JSON")
}

/// The funds less `n` payouts available in USD, with no payout in flight.
fn after_payouts(n: i64) -> Value {
    json!({
        "object": "balance",
        "available": [{ "amount": FUNDS - n * AMOUNT, "currency": "USD" }],
        "pending": [],
    })
}

async fn payout_crash_then(backend: Backend, point: &str, client: Client) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    {
        let service = start(&db, &settings, &[]).await;
        let response = post_to(&service, "/charges", &new_key(), &visa(FUNDS))
            .await
            .expect("charge");
        assert_eq!(response.status().as_u16(), 201);
    }
    let key = new_key();
    let body = payout(AMOUNT);

    let mut crashing = start(&db, &settings, &crash_env(point)).await;
    assert!(
        post_to(&crashing, "/payouts", &key, &body).await.is_err(),
        "the service dies before it answers"
    );
    assert!(!crashing.wait_exit().await, "the service was aborted");

    let service = start(&db, &settings, &[]).await;
    let first_answer = match client {
        Client::RetriesAfterLockTimeout => {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            let response = post_to(&service, "/payouts", &key, &body)
                .await
                .expect("answer");
            assert_eq!(response.status().as_u16(), 201);
            Some(response.bytes().await.expect("body").to_vec())
        }
        Client::NeverRetries => {
            let paid_before_crash = point != "after_claim";
            let expected = if paid_before_crash {
                "completed"
            } else {
                "failed"
            };
            assert_eq!(wait_until_settled(&db, &key).await, expected);
            None
        }
        Client::RetriesAtOnce => unreachable!("not a cell of the payout matrix"),
    };

    let expected = if point == "after_claim" && client == Client::NeverRetries {
        0
    } else {
        1
    };
    assert_eq!(payout_footprint(&db, &card_sim).await, paid_out(expected));
    // A payout never made gives its reservation back; one made keeps it, as paid.
    assert_eq!(balance(&service).await, after_payouts(expected));

    // Every later retry replays one and the same response (after a failed record, the first
    // of them executes it under a new processor key: still one payout).
    let (status, later) = post_until_final_to(&service, "/payouts", &key, &body).await;
    assert_eq!(status, 201);
    for _ in 0..2 {
        let replay = post_to(&service, "/payouts", &key, &body)
            .await
            .expect("replay");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.bytes().await.expect("body").to_vec(), later);
    }
    if let Some(first) = first_answer {
        assert_eq!(
            first, later,
            "the client's first answer is the one replayed"
        );
    }
    assert_eq!(payout_footprint(&db, &card_sim).await, paid_out(1));
    assert_eq!(balance(&service).await, after_payouts(1));
}

async fn payout_crash_after_claim_then_client_never_retries(backend: Backend) {
    payout_crash_then(backend, "after_claim", Client::NeverRetries).await;
}

async fn payout_crash_after_claim_then_client_retries_late(backend: Backend) {
    payout_crash_then(backend, "after_claim", Client::RetriesAfterLockTimeout).await;
}

// `after_charge` is the point after the effect, whatever the operation's effect is.
async fn payout_crash_after_effect_then_client_never_retries(backend: Backend) {
    payout_crash_then(backend, "after_charge", Client::NeverRetries).await;
}

async fn payout_crash_after_effect_then_client_retries_late(backend: Backend) {
    payout_crash_then(backend, "after_charge", Client::RetriesAfterLockTimeout).await;
}

async fn payout_crash_after_commit_then_client_never_retries(backend: Backend) {
    payout_crash_then(backend, "after_commit", Client::NeverRetries).await;
}

async fn payout_crash_after_commit_then_client_retries_late(backend: Backend) {
    payout_crash_then(backend, "after_commit", Client::RetriesAfterLockTimeout).await;
}

/// The service is aborted on PostgreSQL inside a batch of at least two payouts' finishes,
/// their records completed and their payouts, ledger transactions and events written in the
/// batch's transaction, before its commit. Restarted, every payout, retried under its key, ends
/// with exactly one payout at the processor, one paid payout row, one ledger transaction and
/// one event, none left pending: the batch wrote nothing, and its payouts are finished from
/// their effect keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_inside_a_batch_of_payouts_loses_no_payout_and_doubles_none() {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let settings = settings(&card_sim);
    {
        let service = start(&db, &settings, &[]).await;
        // Enough for every payout of twenty rounds of eight.
        let response = post_to(&service, "/charges", &new_key(), &visa(160 * AMOUNT))
            .await
            .expect("charge");
        assert_eq!(response.status().as_u16(), 201);
    }
    let body = payout(AMOUNT);
    let sent = {
        let mut crashing = start(&db, &settings, &crash_env("in_batch_of_finishes")).await;
        concurrent_rounds_until_aborted(&db, &mut crashing, "/payouts", &body).await
    };
    let service = start(&db, &settings, &[]).await;
    each_retried_until_created(&service, "/payouts", &sent, &body).await;
    assert_eq!(
        payout_footprint(&db, &card_sim).await,
        paid_out(sent.len() as i64)
    );
}

on_every_backend!(
    payout_crash_after_claim_then_client_never_retries,
    payout_crash_after_claim_then_client_retries_late,
    payout_crash_after_effect_then_client_never_retries,
    payout_crash_after_effect_then_client_retries_late,
    payout_crash_after_commit_then_client_never_retries,
    payout_crash_after_commit_then_client_retries_late,
);
