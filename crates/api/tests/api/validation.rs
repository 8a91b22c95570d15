//! Bad input gets a clear problem+json error, stores nothing and leaves the key usable.

use reqwest::RequestBuilder;
use serde_json::json;

use crate::helpers::{ACME, Backend, Footprint, TestApp, new_key, problem, spawn_app, visa};

/// A bad request: what it is, how to send it under a key, and the answer it must get.
struct Case {
    name: &'static str,
    build: fn(&TestApp, &str) -> RequestBuilder,
    status: u16,
    code: &'static str,
}

fn post(app: &TestApp) -> RequestBuilder {
    app.client.post(app.url("/charges"))
}

/// A correctly authenticated and keyed request with a raw JSON body.
fn raw(app: &TestApp, key: &str, body: &str) -> RequestBuilder {
    post(app)
        .bearer_auth(ACME)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "invalid JSON",
            build: |a, k| raw(a, k, "{\"amount\": 100,"),
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "not an object",
            build: |a, k| raw(a, k, "[1, 2]"),
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "empty body",
            build: |a, k| raw(a, k, ""),
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "amount as a string",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":"100","currency":"usd","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "fractional amount",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":10.5,"currency":"usd","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "exponent amount",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":1e3,"currency":"usd","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "zero amount",
            build: |a, k| raw(a, k, r#"{"amount":0,"currency":"usd","source":"tok_visa"}"#),
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "negative amount",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":-5,"currency":"usd","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "amount above the maximum",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":100000000,"currency":"usd","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "amount beyond i64",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":99999999999999999999999,"currency":"usd","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "unknown currency",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":100,"currency":"XYZ","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "missing source",
            build: |a, k| raw(a, k, r#"{"amount":100,"currency":"usd"}"#),
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "empty source",
            build: |a, k| raw(a, k, r#"{"amount":100,"currency":"usd","source":""}"#),
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "unknown field",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":100,"currency":"usd","source":"tok_visa","ammount":1}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "NUL in the description",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":100,"currency":"usd","source":"tok_visa","description":"a\u0000b"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "duplicate field",
            build: |a, k| {
                raw(
                    a,
                    k,
                    r#"{"amount":100,"amount":200,"currency":"usd","source":"tok_visa"}"#,
                )
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "description over 500 characters",
            build: |a, k| {
                post(a).bearer_auth(ACME).header("Idempotency-Key", k)
                .json(&json!({"amount": 100, "currency": "usd", "source": "tok_visa", "description": "d".repeat(501)}))
            },
            status: 400,
            code: "invalid_request",
        },
        Case {
            name: "body over 64 KiB",
            build: |a, k| {
                post(a).bearer_auth(ACME).header("Idempotency-Key", k)
                .json(&json!({"amount": 100, "currency": "usd", "source": "tok_visa", "description": "d".repeat(70_000)}))
            },
            status: 413,
            code: "payload_too_large",
        },
        Case {
            name: "no content type",
            build: |a, k| {
                post(a)
                    .bearer_auth(ACME)
                    .header("Idempotency-Key", k)
                    .body(visa(100).to_string())
            },
            status: 415,
            code: "unsupported_media_type",
        },
        Case {
            name: "form content type",
            build: |a, k| {
                post(a)
                    .bearer_auth(ACME)
                    .header("Idempotency-Key", k)
                    .header("Content-Type", "application/x-www-form-urlencoded")
                    .body("amount=100")
            },
            status: 415,
            code: "unsupported_media_type",
        },
        Case {
            name: "no API key",
            build: |a, k| post(a).header("Idempotency-Key", k).json(&visa(100)),
            status: 401,
            code: "unauthorized",
        },
        Case {
            name: "unknown API key",
            build: |a, k| {
                post(a)
                    .bearer_auth("sk_test_nobody")
                    .header("Idempotency-Key", k)
                    .json(&visa(100))
            },
            status: 401,
            code: "unauthorized",
        },
        Case {
            name: "another authorization scheme",
            build: |a, k| {
                post(a)
                    .basic_auth(ACME, Some(""))
                    .header("Idempotency-Key", k)
                    .json(&visa(100))
            },
            status: 401,
            code: "unauthorized",
        },
    ]
}

async fn every_bad_request_is_a_problem_stores_nothing_and_leaves_the_key_usable(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut keys = Vec::new();
    for case in cases() {
        let key = new_key();
        let response = (case.build)(&app, &key).send().await.expect(case.name);
        let (status, body) = problem(response).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (case.status, Some(case.code)),
            "{}",
            case.name
        );
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{}: a detail says what is wrong",
            case.name
        );
        assert_eq!(
            app.footprint().await,
            Footprint::EMPTY,
            "{}: nothing is stored",
            case.name
        );
        keys.push(key);
    }
    // None of the keys was consumed: a valid request under each executes normally.
    for key in &keys {
        let response = app.post_charge(ACME, key, &visa(100)).await;
        assert_eq!(response.status().as_u16(), 201);
        assert!(response.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(app.footprint().await, Footprint::charged(keys.len() as i64));
}

async fn missing_or_malformed_idempotency_keys_are_400_and_store_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let missing = post(&app)
        .bearer_auth(ACME)
        .json(&visa(100))
        .send()
        .await
        .expect("send");
    let (status, body) = problem(missing).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("idempotency_key_missing"))
    );

    let long = "k".repeat(256);
    for key in [
        "",
        "   ",
        "two words",
        "\"unterminated",
        "tab\there",
        long.as_str(),
    ] {
        let response = post(&app)
            .bearer_auth(ACME)
            .header("Idempotency-Key", key)
            .json(&visa(100))
            .send()
            .await
            .expect("send");
        let (status, body) = problem(response).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("idempotency_key_invalid")),
            "{key:?}"
        );
    }
    let non_ascii = post(&app)
        .bearer_auth(ACME)
        .header(
            "Idempotency-Key",
            reqwest::header::HeaderValue::from_bytes(b"cl\xc3\xa9").expect("header"),
        )
        .json(&visa(100))
        .send()
        .await
        .expect("send");
    assert_eq!(
        problem(non_ascii).await.1["code"],
        "idempotency_key_invalid"
    );

    let twice = post(&app)
        .bearer_auth(ACME)
        .header("Idempotency-Key", "a")
        .header("Idempotency-Key", "b")
        .json(&visa(100))
        .send()
        .await
        .expect("send");
    assert_eq!(problem(twice).await.1["code"], "idempotency_key_invalid");

    assert_eq!(app.footprint().await, Footprint::EMPTY);
    // 255 characters is the longest key accepted.
    assert_eq!(
        app.post_charge(ACME, &"k".repeat(255), &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
}

async fn unknown_routes_and_methods_are_problems(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, body) = problem(app.get(ACME, "/refunds").await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let delete = app
        .client
        .delete(app.url("/charges"))
        .bearer_auth(ACME)
        .send()
        .await
        .expect("send");
    let (status, body) = problem(delete).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
}

on_every_backend!(
    every_bad_request_is_a_problem_stores_nothing_and_leaves_the_key_usable,
    missing_or_malformed_idempotency_keys_are_400_and_store_nothing,
    unknown_routes_and_methods_are_problems,
);
