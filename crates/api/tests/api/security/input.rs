//! No card number is ever accepted, and a body is a JSON object: both refused before the claim.

use reqwest::Response;
use serde_json::{Value, json};

use super::header;
use crate::helpers::{
    ACME, Backend, Footprint, TestApp, count_rows, new_key, problem, spawn_app, visa,
};

/// A raw JSON body under a fresh key, as acme.
async fn post_raw(app: &TestApp, path: &str, key: &str, body: &str) -> Response {
    app.client
        .post(app.url(path))
        .bearer_auth(ACME)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("POST")
}

/// A card number sent where a token belongs (or pasted into the description) would be stored
/// in the database, cached, logged and replayed: the service would be in PCI scope. Such a
/// request is refused with 400 `card_number_not_allowed` before anything is stored, the answer
/// does not repeat the number, and the key stays free for the corrected request.
async fn card_numbers_are_refused_store_nothing_and_leave_the_key_free(backend: Backend) {
    let app = spawn_app(backend).await;
    let bodies = [
        json!({ "amount": 100, "currency": "usd", "source": "4111111111111111" }),
        json!({ "amount": 100, "currency": "usd", "source": "4111-1111-1111-1111" }),
        json!({ "amount": 100, "currency": "usd", "source": "tok_visa",
                "description": "card 4111 1111 1111 1111 exp 12/29 cvv 123" }),
        json!({ "amount": 100, "currency": "usd", "source": "tok_visa",
                "description": "card 4111-1111-1111-1111" }),
    ];
    let mut keys = Vec::new();
    for body in &bodies {
        let key = new_key();
        let response = app.post_charge(ACME, &key, body).await;
        let (status, answer) = problem(response).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some("card_number_not_allowed")),
            "{body}"
        );
        let digits = answer.to_string().replace([' ', '-'], "");
        assert!(
            !digits.contains("4111111111111111"),
            "the answer repeats the number: {answer}"
        );
        assert_eq!(app.footprint().await, Footprint::EMPTY, "{body}");
        keys.push(key);
    }
    for key in &keys {
        let response = app.post_charge(ACME, key, &visa(100)).await;
        assert_eq!(response.status().as_u16(), 201);
        assert_eq!(header(&response, "idempotent-replayed"), None);
    }
    assert_eq!(app.footprint().await, Footprint::charged(keys.len() as i64));
}

/// Only tokens are sources: anything else (`card_visa`, a name, an account number) is not
/// passed on to the processor as if it were one. It is a 400 `invalid_request` and stores
/// nothing.
async fn a_source_that_is_not_a_token_is_invalid(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let body = json!({ "amount": 100, "currency": "usd", "source": "card_visa" });
    let (status, answer) = problem(app.post_charge(ACME, &key, &body).await).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert_eq!(app.footprint().await, Footprint::EMPTY);
    app.assert_key_is_free(&key).await;
}

/// The card number check looks for card numbers, not for long numbers: sixteen digits that
/// fail the Luhn check (an order number, a reference) in a description are accepted.
async fn sixteen_digits_that_fail_luhn_are_not_a_card_number(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = json!({ "amount": 100, "currency": "usd", "source": "tok_visa",
                       "description": "order 4111111111111112" });
    let response = app.post_charge(ACME, &new_key(), &body).await;
    assert_eq!(response.status().as_u16(), 201);
    let charge: Value = response.json().await.expect("charge JSON");
    assert_eq!(charge["description"], "order 4111111111111112");
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

/// A JSON array is not a request object: read positionally or half-validated it could become
/// a charge nobody described. As a charge body and as a refund body it is a 400
/// `invalid_request`, stores nothing, and leaves the key free.
async fn a_json_array_as_a_charge_or_refund_body_is_400_and_stores_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let response = post_raw(
        &app,
        "/charges",
        &key,
        r#"[100,"usd","tok_visa","via array"]"#,
    )
    .await;
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert_eq!(app.footprint().await, Footprint::EMPTY);
    app.assert_key_is_free(&key).await;

    let charge = app.charged(500, "tok_visa").await;
    let refunds = format!("/charges/{charge}/refunds");
    let key = new_key();
    let (status, body) = problem(post_raw(&app, &refunds, &key, "[100]").await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert_eq!(count_rows(app.db(), "refunds").await, 0);
    assert_eq!(app.footprint().await, Footprint::charged(2));
    let refund = app
        .post_refund(ACME, &charge, &key, &json!({ "amount": 100 }))
        .await;
    assert_eq!(refund.status().as_u16(), 201, "the key was not consumed");
    assert_eq!(count_rows(app.db(), "refunds").await, 1);
}

// ---------------------------------------------------------------------------------------------

on_every_backend!(
    card_numbers_are_refused_store_nothing_and_leave_the_key_free,
    a_source_that_is_not_a_token_is_invalid,
    sixteen_digits_that_fail_luhn_are_not_a_card_number,
    a_json_array_as_a_charge_or_refund_body_is_400_and_stores_nothing,
);
