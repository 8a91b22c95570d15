//! The wire protocol itself, over raw HTTP: statuses, bodies, and what a bad request does.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{charge_body, spawn_sim};

#[tokio::test]
async fn each_outcome_has_its_status_and_body() {
    let sim = spawn_sim().await;

    let (status, body) = sim.post_charge(Some("ok"), &charge_body("tok_visa")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["amount"], 1999);
    assert_eq!(body["currency"], "USD");
    assert_eq!(body["status"], "succeeded");
    assert!(body["id"].is_string(), "{body}");

    let (status, body) = sim
        .post_charge(Some("no"), &charge_body("tok_chargeDeclined"))
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(body["error"]["type"], "card_error");
    assert_eq!(body["error"]["decline_code"], "generic_decline");
    assert!(body["error"]["message"].is_string(), "{body}");

    let (status, body) = sim
        .post_charge(Some("err"), &charge_body("tok_processingError"))
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"]["type"], "api_error");
    assert!(body["error"]["message"].is_string(), "{body}");

    assert_eq!(sim.charges_created().await, 1);
}

#[tokio::test]
async fn a_replay_returns_the_original_charge_even_for_a_different_body() {
    let sim = spawn_sim().await;
    let (_, first) = sim.post_charge(Some("k"), &charge_body("tok_visa")).await;
    let other = json!({"amount": 5, "currency": "eur", "source": "tok_mastercard"});
    let (status, replay) = sim.post_charge(Some("k"), &other).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay, first);
    assert_eq!(sim.charges_created().await, 1);
}

#[tokio::test]
async fn a_charge_without_an_idempotency_key_is_a_json_400_and_creates_nothing() {
    let sim = spawn_sim().await;
    let (status, body) = sim.post_charge(None, &charge_body("tok_visa")).await;

    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(sim.charges_created().await, 0);
}

#[tokio::test]
async fn a_bad_body_is_a_json_400_and_creates_nothing() {
    let sim = spawn_sim().await;
    let bad_bodies = [
        json!({"currency": "USD", "source": "tok_visa"}),
        json!({"amount": "12", "currency": "USD", "source": "tok_visa"}),
        json!({"amount": 0, "currency": "USD", "source": "tok_visa"}),
        json!({"amount": 100, "currency": "XXX", "source": "tok_visa"}),
        json!({"amount": 100, "currency": "USD", "source": ""}),
    ];
    for (i, body) in bad_bodies.iter().enumerate() {
        let (status, answer) = sim.post_charge(Some(&format!("bad-{i}")), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{body}");
    }

    let not_json = sim
        .http()
        .post(sim.url("/v1/charges"))
        .header("Idempotency-Key", "bad-json")
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("POST");
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);
    assert_eq!(sim.charges_created().await, 0);
}

#[tokio::test]
async fn lookups_health_and_unknown_routes() {
    let sim = spawn_sim().await;
    let get = |path: &str| sim.http().get(sim.url(path)).send();

    assert_eq!(
        get("/healthz").await.expect("healthz").status(),
        StatusCode::OK
    );
    let missing = get("/v1/charges?idempotency_key=nope").await.expect("GET");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let no_query = get("/v1/charges").await.expect("GET");
    assert_eq!(no_query.status(), StatusCode::BAD_REQUEST);
    let unknown = get("/v2/anything").await.expect("GET");
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    assert_eq!(sim.charges_created().await, 0);
}
