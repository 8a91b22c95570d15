//! Concurrent duplicates: one key, many simultaneous requests, exactly one charge.

use std::collections::HashSet;

use futures::future::join_all;
use serde_json::{Value, json};

use crate::helpers::{ACME, Backend, Footprint, TestApp, new_key, spawn_app, visa};

/// Fires `n` identical requests at once and returns (status, retry-after, replayed, body).
async fn fire(
    app: &TestApp,
    n: usize,
    key: &str,
    body: &Value,
) -> Vec<(u16, Option<u64>, bool, Vec<u8>)> {
    let requests = (0..n).map(|_| async {
        let response = app.charge(ACME, key, body).send().await.expect("request");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = header("retry-after").and_then(|v| v.parse().ok());
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        let status = response.status().as_u16();
        (
            status,
            retry_after,
            replayed,
            response.bytes().await.expect("body").to_vec(),
        )
    });
    join_all(requests).await
}

/// Every 201 is the same charge, every other answer a 409 with Retry-After.
fn assert_one_charge_answered(results: &[(u16, Option<u64>, bool, Vec<u8>)]) {
    let created: HashSet<&Vec<u8>> = results
        .iter()
        .filter(|r| r.0 == 201)
        .map(|r| &r.3)
        .collect();
    assert_eq!(created.len(), 1, "all 201 responses carry the same bytes");
    let fresh = results.iter().filter(|r| r.0 == 201 && !r.2).count();
    assert_eq!(
        fresh, 1,
        "exactly one response is the first execution; the rest are replays"
    );
    for (status, retry_after, _, _) in results.iter().filter(|r| r.0 != 201) {
        assert_eq!(
            *status, 409,
            "duplicates are answered 201 (replay) or 409, nothing else"
        );
        assert!(
            retry_after.is_some_and(|secs| secs >= 1),
            "409 carries Retry-After >= 1"
        );
    }
}

async fn a_hundred_concurrent_duplicates_charge_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let results = fire(&app, 100, &key, &visa(1999)).await;

    assert_one_charge_answered(&results);
    assert_eq!(app.footprint().await, Footprint::charged(1));
    let processor_charges: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT processor_charge_id) FROM charges")
            .fetch_one(app.db())
            .await
            .expect("count");
    assert_eq!(processor_charges, 1);
}

async fn duplicates_of_a_slow_charge_in_flight_get_409_then_the_replay(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    // tok_slow holds the first attempt at the processor for two seconds: every duplicate
    // arrives while it is in flight.
    let body = json!({ "amount": 300, "currency": "usd", "source": "tok_slow" });
    let results = fire(&app, 100, &key, &body).await;

    assert_one_charge_answered(&results);
    let conflicts = results.iter().filter(|r| r.0 == 409).count();
    assert_eq!(
        conflicts, 99,
        "while the first attempt holds the lock, every duplicate is refused"
    );
    let after = app.post_charge(ACME, &key, &body).await;
    assert_eq!(after.status().as_u16(), 201);
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

async fn concurrent_requests_with_distinct_keys_each_charge_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let keys: Vec<String> = (0..40).map(|_| new_key()).collect();
    let body = visa(100);
    let responses = join_all(keys.iter().map(|key| app.post_charge(ACME, key, &body))).await;
    assert!(responses.iter().all(|r| r.status().as_u16() == 201));
    assert_eq!(app.footprint().await, Footprint::charged(40));
}

/// A duplicate of a `tok_slow` charge (2 s) is told to come back when the answer is likely
/// ready, not when the 30 s lock ends, and is pointed at `Prefer: wait` as the alternative.
async fn a_duplicate_of_a_slow_charge_is_told_to_retry_within_seconds_not_the_whole_lock(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let body = json!({ "amount": 700, "currency": "usd", "source": "tok_slow" });
    for round in 0..2 {
        let key = new_key();
        let first = app.charge(ACME, &key, &body).send();
        let duplicate = async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            app.post_charge(ACME, &key, &body).await
        };
        let (first, duplicate) = tokio::join!(first, duplicate);
        assert_eq!(first.expect("first").status().as_u16(), 201);
        let retry_after: u64 = duplicate.headers()["retry-after"]
            .to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .expect("Retry-After in seconds");
        // No history yet: 1 s. After one 2 s attempt: its duration, rounded up.
        assert!(
            (1..=5).contains(&retry_after),
            "round {round}: Retry-After {retry_after}"
        );
        let (status, problem) = crate::helpers::problem(duplicate).await;
        assert_eq!(status, 409);
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("Prefer: wait=N")),
            "{problem}"
        );
    }
}

on_every_backend!(
    a_duplicate_of_a_slow_charge_is_told_to_retry_within_seconds_not_the_whole_lock,
    a_hundred_concurrent_duplicates_charge_once,
    duplicates_of_a_slow_charge_in_flight_get_409_then_the_replay,
    concurrent_requests_with_distinct_keys_each_charge_once,
);
