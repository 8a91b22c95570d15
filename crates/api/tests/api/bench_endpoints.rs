//! The bench-only floors (feature `bench`) do what the benchmarks assume they do.

use serde_json::Value;

use crate::helpers::{Backend, Footprint, TestApp, spawn_app, visa};

async fn the_charge_floor_writes_the_same_rows_without_an_idempotency_record(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .post(app.url("/bench/charge"))
        .json(&visa(100))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 201);
    let expected = Footprint {
        records: 0,
        ..Footprint::charged(1)
    };
    assert_eq!(app.footprint().await, expected);
}

/// Charges each of `keys`, then moves the expiry of `expired` a second into the past.
async fn charge_and_expire(app: &TestApp, keys: &[&str], expired: &[&str]) {
    for key in keys {
        assert_eq!(
            app.post_charge(crate::helpers::ACME, key, &visa(100))
                .await
                .status()
                .as_u16(),
            201
        );
    }
    let listed: Vec<String> = expired.iter().map(|k| format!("'{k}'")).collect();
    let expire = format!(
        "UPDATE idempotency_records SET expires_at = {} WHERE idempotency_key IN ({})",
        app.database.seconds_ago(1),
        listed.join(", ")
    );
    sqlx::query(&expire)
        .execute(app.db())
        .await
        .expect("expire");
}

/// Runs the reap floor and returns its report.
async fn reap(app: &TestApp, path: &str) -> Value {
    app.client
        .post(app.url(path))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json")
}

async fn the_reap_floor_deletes_expired_finished_records_only(backend: Backend) {
    let app = spawn_app(backend).await;
    charge_and_expire(&app, &["a", "b"], &["a"]).await;
    let report = reap(&app, "/bench/reap").await;
    assert_eq!(report["deleted"], 1);
    assert_eq!(app.footprint().await.records, 1);
}

async fn the_reap_floor_runs_the_reapers_batches_until_one_comes_back_short(backend: Backend) {
    let app = spawn_app(backend).await;
    charge_and_expire(&app, &["a", "b", "c"], &["a", "b", "c"]).await;
    let report = reap(&app, "/bench/reap?batch=1").await;
    // Three full batches of one, then the short one that finds nothing.
    assert_eq!(
        (report["deleted"].as_u64(), report["statements"].as_u64()),
        (Some(3), Some(4))
    );
    assert!(report["longest_statement_ms"].as_f64().is_some());
    assert_eq!(app.footprint().await.records, 0);
}

async fn the_read_floor_answers_a_records_stored_body_by_its_key(backend: Backend) {
    let app = spawn_app(backend).await;
    let charged = app
        .post_charge(crate::helpers::ACME, "read-me", &visa(100))
        .await;
    assert_eq!(charged.status().as_u16(), 201);
    let stored = charged.bytes().await.expect("body");
    let read = app
        .client
        .get(app.url("/bench/read?key=read-me"))
        .send()
        .await
        .expect("send");
    assert_eq!(read.status().as_u16(), 200);
    assert_eq!(read.bytes().await.expect("body"), stored);
    let missing = app
        .client
        .get(app.url("/bench/read?key=never-used"))
        .send()
        .await
        .expect("send");
    assert_eq!(missing.status().as_u16(), 404);
    assert_eq!(
        app.footprint().await,
        Footprint::charged(1),
        "reading writes nothing"
    );
}

async fn the_two_commit_floor_leaves_what_a_first_charge_leaves(backend: Backend) {
    let app = spawn_app(backend).await;
    for _ in 0..2 {
        let response = app
            .client
            .post(app.url("/bench/charge-2"))
            .json(&visa(100))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status().as_u16(), 201);
    }
    assert_eq!(app.footprint().await, Footprint::charged(2));
    let completed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotency_records r JOIN charges c ON c.id = r.resource_id
         WHERE r.state = 'completed' AND r.recovery_point = 'finished'
           AND r.response_status = 201 AND r.locked_until IS NULL",
    )
    .fetch_one(app.db())
    .await
    .expect("count");
    assert_eq!(completed, 2, "each record completed with its own charge");
}

async fn the_redis_floor_answers(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .get(app.url("/bench/redis"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 200);
}

on_every_backend!(
    the_charge_floor_writes_the_same_rows_without_an_idempotency_record,
    the_reap_floor_deletes_expired_finished_records_only,
    the_reap_floor_runs_the_reapers_batches_until_one_comes_back_short,
    the_read_floor_answers_a_records_stored_body_by_its_key,
    the_two_commit_floor_leaves_what_a_first_charge_leaves,
    the_redis_floor_answers,
);
