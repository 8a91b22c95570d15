//! The bench-only floors (feature `bench`) do what the benchmarks assume they do.

use serde_json::Value;

use crate::helpers::{Footprint, spawn_app, visa};

#[tokio::test]
async fn the_charge_floor_writes_the_same_rows_without_an_idempotency_record() {
    let app = spawn_app().await;
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

#[tokio::test]
async fn the_reap_floor_deletes_expired_finished_records_only() {
    let app = spawn_app().await;
    for key in ["a", "b"] {
        assert_eq!(
            app.post_charge(crate::helpers::ACME, key, &visa(100))
                .await
                .status()
                .as_u16(),
            201
        );
    }
    sqlx::query("UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE idempotency_key = 'a'")
        .execute(&app.db)
        .await
        .expect("expire one");
    let report: Value = app
        .client
        .post(app.url("/bench/reap"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(report["deleted"], 1);
    assert_eq!(app.footprint().await.records, 1);
}

#[tokio::test]
async fn the_redis_floor_answers() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(app.url("/bench/redis"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 200);
}
