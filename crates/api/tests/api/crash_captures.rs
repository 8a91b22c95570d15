//! The crash matrix of a capture and of a cancel: the service is aborted after the claim (and
//! the hold's claim), after the capture or void at the processor, or after the commit,
//! restarted on the same database against the same card-sim process, and the client then
//! never retries, or retries only after the lock timeout. In every cell: exactly one capture
//! (or void) at the processor, none of the other (none at all when the crash came before the
//! processor call and nobody retried), the hold ended once (one ledger transaction and one
//! `payment.completed` for a capture, one `payment.canceled` for a cancel), and every later
//! retry replays one and the same response.

use std::time::Duration;

use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::crash::{
    Client, crash_env, post_to, post_until_final_to, settings, start, wait_until_settled,
};
use crate::helpers::{Backend, TestDatabase, count_rows, new_key};

/// What ends a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Capture,
    Cancel,
}

impl End {
    fn path(self, charge: &str) -> String {
        match self {
            Self::Capture => format!("/charges/{charge}/capture"),
            Self::Cancel => format!("/charges/{charge}/cancel"),
        }
    }

    fn body(self) -> Value {
        match self {
            Self::Capture => json!({ "amount_to_capture": 1_200 }),
            Self::Cancel => json!({ "cancellation_reason": "requested_by_customer" }),
        }
    }

    /// The footprint of `n` of this end: processor captures and voids, ledger transactions,
    /// `payment.completed` and `payment.canceled` events, and the hold's status.
    fn ended(self, n: i64) -> ([i64; 5], &'static str) {
        match (self, n) {
            (_, 0) => ([0, 0, 0, 0, 0], "requires_capture"),
            (Self::Capture, _) => ([n, 0, n, n, 0], "captured"),
            (Self::Cancel, _) => ([0, n, 0, 0, n], "canceled"),
        }
    }
}

/// What ended the hold: processor captures and voids, ledger transactions, the events, and the
/// hold's `capture_status`.
async fn hold_footprint(db: &TestDatabase, card_sim: &CardSim) -> ([i64; 5], String) {
    let events = |event_type: &'static str| async move {
        sqlx::query_scalar::<_, i64>(&format!(
            "SELECT count(*) FROM outbox_events WHERE event_type = '{event_type}'"
        ))
        .fetch_one(&db.pool)
        .await
        .expect("count events")
    };
    let status: String = sqlx::query_scalar("SELECT capture_status FROM charges")
        .fetch_one(&db.pool)
        .await
        .expect("the hold");
    (
        [
            card_sim.captures_created().await,
            card_sim.voids_created().await,
            count_rows(&db.pool, "ledger_transactions").await,
            events("payment.completed").await,
            events("payment.canceled").await,
        ],
        status,
    )
}

/// The id of a hold of 5,000, made by a service started for it and stopped.
async fn held(db: &TestDatabase, settings: &[(&'static str, String)]) -> String {
    let service = start(db, settings, &[]).await;
    let body =
        json!({ "amount": 5_000, "currency": "usd", "source": "tok_visa", "capture": false });
    let response = post_to(&service, "/charges", &new_key(), &body)
        .await
        .expect("hold");
    assert_eq!(response.status().as_u16(), 201);
    let charge: Value = response.json().await.expect("charge");
    charge["id"].as_str().expect("id").to_owned()
}

async fn hold_crash_then(backend: Backend, end: End, point: &str, client: Client) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let charge = held(&db, &settings).await;
    let (path, body, key) = (end.path(&charge), end.body(), new_key());

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
            assert_eq!(response.status().as_u16(), 200);
            Some(response.bytes().await.expect("body").to_vec())
        }
        Client::NeverRetries => {
            let made_before_crash = point != "after_claim";
            let expected = if made_before_crash {
                "completed"
            } else {
                "failed"
            };
            assert_eq!(wait_until_settled(&db, &key).await, expected);
            None
        }
        Client::RetriesAtOnce => unreachable!("not a cell of the hold matrix"),
    };

    let expected = if point == "after_claim" && client == Client::NeverRetries {
        0
    } else {
        1
    };
    let (counts, status) = end.ended(expected);
    assert_eq!(
        hold_footprint(&db, &card_sim).await,
        (counts, status.to_owned())
    );

    // Every later retry replays one and the same response (after a failed record, whose claim
    // on the hold was released with it, the first of them executes it under a new processor
    // key: still one capture or void).
    let (status, later) = post_until_final_to(&service, &path, &key, &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&later));
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
    let (counts, status) = end.ended(1);
    assert_eq!(
        hold_footprint(&db, &card_sim).await,
        (counts, status.to_owned())
    );
}

async fn capture_crash_after_claim_then_client_never_retries(backend: Backend) {
    hold_crash_then(backend, End::Capture, "after_claim", Client::NeverRetries).await;
}

async fn capture_crash_after_claim_then_client_retries_late(backend: Backend) {
    let client = Client::RetriesAfterLockTimeout;
    hold_crash_then(backend, End::Capture, "after_claim", client).await;
}

// `after_charge` is the point after the effect, whatever the operation's effect is.
async fn capture_crash_after_effect_then_client_never_retries(backend: Backend) {
    hold_crash_then(backend, End::Capture, "after_charge", Client::NeverRetries).await;
}

async fn capture_crash_after_effect_then_client_retries_late(backend: Backend) {
    let client = Client::RetriesAfterLockTimeout;
    hold_crash_then(backend, End::Capture, "after_charge", client).await;
}

async fn capture_crash_after_commit_then_client_never_retries(backend: Backend) {
    hold_crash_then(backend, End::Capture, "after_commit", Client::NeverRetries).await;
}

async fn cancel_crash_after_claim_then_client_never_retries(backend: Backend) {
    hold_crash_then(backend, End::Cancel, "after_claim", Client::NeverRetries).await;
}

async fn cancel_crash_after_effect_then_client_never_retries(backend: Backend) {
    hold_crash_then(backend, End::Cancel, "after_charge", Client::NeverRetries).await;
}

async fn cancel_crash_after_effect_then_client_retries_late(backend: Backend) {
    let client = Client::RetriesAfterLockTimeout;
    hold_crash_then(backend, End::Cancel, "after_charge", client).await;
}

async fn cancel_crash_after_commit_then_client_retries_late(backend: Backend) {
    let client = Client::RetriesAfterLockTimeout;
    hold_crash_then(backend, End::Cancel, "after_commit", client).await;
}

on_every_backend!(
    capture_crash_after_claim_then_client_never_retries,
    capture_crash_after_claim_then_client_retries_late,
    capture_crash_after_effect_then_client_never_retries,
    capture_crash_after_effect_then_client_retries_late,
    capture_crash_after_commit_then_client_never_retries,
    cancel_crash_after_claim_then_client_never_retries,
    cancel_crash_after_effect_then_client_never_retries,
    cancel_crash_after_effect_then_client_retries_late,
    cancel_crash_after_commit_then_client_retries_late,
);
