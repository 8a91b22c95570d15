//! `GET /idempotency-keys/{key}` and API keys configured as hashes.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{ACME, Backend, GLOBEX, new_key, problem, spawn_app, spawn_app_with, visa};

async fn a_completed_key_shows_its_state_but_never_the_stored_response(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let charge: Value = app
        .post_charge(ACME, &key, &visa(100))
        .await
        .json()
        .await
        .expect("charge");

    let response = app.get(ACME, &format!("/idempotency-keys/{key}")).await;
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("body");
    let view: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(view["object"], "idempotency_key");
    assert_eq!(view["key"], key.as_str());
    assert_eq!(view["operation"], "charges.create");
    assert_eq!(view["response_schema_version"], 1);
    assert_eq!(
        (view["state"].as_str(), view["recovery_point"].as_str()),
        (Some("completed"), Some("finished"))
    );
    assert_eq!(view["attempts"], 1);
    assert_eq!(view["response_status"], 201);
    assert_eq!(view["fingerprint"].as_str().map(str::len), Some(64));
    assert!(view["locked_until"].is_null());
    let id = charge["id"].as_str().unwrap_or_default();
    assert!(
        !text.contains(id) && !text.contains("tok_visa"),
        "no stored response in the view: {text}"
    );
}

async fn an_in_flight_key_shows_pending_with_its_lock(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let slow = json!({ "amount": 100, "currency": "usd", "source": "tok_slow" });
    let (first, view) = tokio::join!(app.post_charge(ACME, &key, &slow), async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        app.get(ACME, &format!("/idempotency-keys/{key}"))
            .await
            .json::<Value>()
            .await
            .expect("view")
    });
    assert_eq!(view["state"], "pending");
    assert!(view["locked_until"].is_string());
    assert!(view["response_status"].is_null());
    assert_eq!(first.status().as_u16(), 201);
}

async fn unknown_foreign_and_malformed_keys(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    assert_eq!(
        app.post_charge(ACME, &key, &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
    let (status, body) = problem(app.get(ACME, "/idempotency-keys/never-used").await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, _) = problem(app.get(GLOBEX, &format!("/idempotency-keys/{key}")).await).await;
    assert_eq!(status, 404, "another tenant's key is not found");
    let (status, body) = problem(
        app.get(ACME, &format!("/idempotency-keys/{}", "k".repeat(256)))
            .await,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("idempotency_key_invalid"))
    );
    let (status, _) = problem(
        app.client
            .get(app.url(&format!("/idempotency-keys/{key}")))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 401);
}

async fn api_keys_come_from_configured_hashes_and_replace_the_demo_keys(backend: Backend) {
    let dir =
        std::env::temp_dir().join(format!("payments-config-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("payments.toml");
    let real_hash = sha256_hex("sk_live_initech");
    std::fs::write(
        &config,
        format!("[[auth.api_keys]]\nkey_sha256 = \"{real_hash}\"\ntenant = \"initech\"\n"),
    )
    .expect("write");
    let app = spawn_app_with(
        backend,
        &[("PAYMENTS_CONFIG", config.to_str().unwrap_or_default())],
    )
    .await;

    let response = app
        .post_charge("sk_live_initech", &new_key(), &visa(100))
        .await;
    assert_eq!(response.status().as_u16(), 201);
    let (status, _) = problem(app.post_charge(ACME, &new_key(), &visa(100)).await).await;
    assert_eq!(
        status, 401,
        "the demo keys are gone once keys are configured"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

async fn a_key_that_does_not_decode_is_a_problem_not_plain_text(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, body) = problem(app.get(ACME, "/idempotency-keys/%C3%28").await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("idempotency_key_invalid"))
    );
}

on_every_backend!(
    a_completed_key_shows_its_state_but_never_the_stored_response,
    an_in_flight_key_shows_pending_with_its_lock,
    unknown_foreign_and_malformed_keys,
    api_keys_come_from_configured_hashes_and_replace_the_demo_keys,
    a_key_that_does_not_decode_is_a_problem_not_plain_text,
);
