//! Hostile input: none of it crashes the service, leaks another tenant's data or leaves a key
//! stuck. Requests a client library would refuse to send go over a raw socket.

use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{
    ACME, Backend, Footprint, GLOBEX, TestApp, new_key, problem, spawn_app, spawn_app_with, visa,
    wait_for_in_flight,
};

/// Sends raw bytes, optionally pauses with the write side open, then reads the whole answer.
async fn raw(app: &TestApp, request: &[u8], then_wait: Duration, rest: Option<&[u8]>) -> String {
    let address = app.base_url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(request).await.expect("write");
    tokio::time::sleep(then_wait).await;
    if let Some(rest) = rest {
        let _ = stream.write_all(rest).await;
    }
    let _ = stream.shutdown().await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn head(key: &str, content_length: usize) -> String {
    format!(
        "POST /charges HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {ACME}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    )
}

fn status_of(answer: &str) -> Option<u16> {
    answer.split_whitespace().nth(1)?.parse().ok()
}

async fn json_nested_ten_thousand_deep_is_a_400_and_stores_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let response = app
        .charge(ACME, &new_key(), &json!({}))
        .body(deep)
        .send()
        .await
        .expect("send");
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert_eq!(app.footprint().await, Footprint::EMPTY);
    // The service is still there.
    assert_eq!(
        app.post_charge(ACME, &new_key(), &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
}

async fn a_body_that_stops_early_stores_nothing_and_leaves_the_key_free(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let body = visa(100).to_string();
    let request = format!("{}{}", head(&key, body.len() + 50), &body[..10]);
    let answer = raw(&app, request.as_bytes(), Duration::ZERO, None).await;
    // The connection ends mid-body: the service answers 400 or just closes; never a 2xx/5xx.
    assert!(status_of(&answer).is_none_or(|s| s == 400), "{answer}");
    assert_eq!(app.footprint().await, Footprint::EMPTY);
    assert_eq!(
        app.post_charge(ACME, &key, &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
}

async fn a_client_stalling_mid_body_gets_408_and_holds_no_lock(backend: Backend) {
    let app = spawn_app_with(backend, &[("PAYMENTS__SERVER__BODY_TIMEOUT_MS", "500")]).await;
    let key = new_key();
    let body = visa(100).to_string();
    let request = format!("{}{}", head(&key, body.len()), &body[..10]);
    let answer = raw(
        &app,
        request.as_bytes(),
        Duration::from_millis(1_500),
        Some(&body.as_bytes()[10..]),
    )
    .await;
    assert_eq!(status_of(&answer), Some(408), "{answer}");
    assert!(
        answer.contains("application/problem+json") && answer.contains("request_timeout"),
        "{answer}"
    );
    assert_eq!(app.footprint().await, Footprint::EMPTY);
    let retry = app.post_charge(ACME, &key, &visa(100)).await;
    assert_eq!(
        retry.status().as_u16(),
        201,
        "the stalled request never claimed the key"
    );
}

async fn control_characters_in_a_key_are_refused_before_the_service_stores_anything(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let body = visa(100).to_string();
    for key in ["a\u{1}b", "a\u{7f}b", "a\u{0}b"] {
        let request = format!("{}{body}", head(key, body.len()));
        let answer = raw(&app, request.as_bytes(), Duration::ZERO, None).await;
        // The HTTP parser itself rejects these bytes (400) before any handler runs.
        assert_eq!(status_of(&answer), Some(400), "{key:?}: {answer}");
    }
    assert_eq!(app.footprint().await, Footprint::EMPTY);
}

/// The instance's limit is one for every tenant: with acme's slow charge holding the only
/// slot, globex's request is shed.
async fn beyond_the_in_flight_limit_requests_are_shed_with_503_and_retry_after(backend: Backend) {
    let app = spawn_app_with(backend, &[("PAYMENTS__SERVER__MAX_IN_FLIGHT", "1")]).await;
    let slow = json!({ "amount": 100, "currency": "usd", "source": "tok_slow" });
    let first_key = new_key();
    let shed_key = new_key();
    let (first, shed) = tokio::join!(app.post_charge(ACME, &first_key, &slow), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        app.post_charge(GLOBEX, &shed_key, &visa(100)).await
    });
    assert_eq!(first.status().as_u16(), 201);
    assert_eq!(
        shed.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let (status, body) = problem(shed).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("overloaded")));
    assert_eq!(
        app.record_state("globex", &shed_key).await,
        None,
        "a shed request stores nothing"
    );
    assert_eq!(
        app.post_charge(GLOBEX, &shed_key, &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
}

async fn many_bad_requests_at_once_leave_the_service_serving(backend: Backend) {
    let app = spawn_app(backend).await;
    let garbage = [
        "",
        "{",
        "null",
        "[]",
        "{\"amount\":",
        "\u{0}",
        "{\"a\":1e999999}",
    ];
    let sends = garbage
        .iter()
        .map(|body| app.charge(ACME, &new_key(), &json!({})).body(*body).send());
    for response in join_all(sends).await {
        assert_eq!(response.expect("answer").status().as_u16(), 400);
    }
    assert_eq!(app.footprint().await, Footprint::EMPTY);
    assert_eq!(
        app.post_charge(ACME, &new_key(), &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
}

async fn two_tenants_with_the_same_keys_never_see_each_others_data_on_any_endpoint(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let acme: Value = app
        .post_charge(ACME, &key, &visa(111))
        .await
        .json()
        .await
        .expect("acme");
    let globex: Value = app
        .post_charge(GLOBEX, &key, &visa(222))
        .await
        .json()
        .await
        .expect("globex");
    assert_ne!(acme["id"], globex["id"]);

    for (api_key, own, other) in [(ACME, &acme, &globex), (GLOBEX, &globex, &acme)] {
        let id = |c: &Value| c["id"].as_str().unwrap_or_default().to_owned();
        assert_eq!(
            app.get(api_key, &format!("/charges/{}", id(own)))
                .await
                .status()
                .as_u16(),
            200
        );
        let (status, _) = problem(app.get(api_key, &format!("/charges/{}", id(other))).await).await;
        assert_eq!(
            status, 404,
            "another tenant's charge is not found (not forbidden)"
        );
        let list: Value = app
            .get(api_key, "/charges")
            .await
            .json()
            .await
            .expect("list");
        assert_eq!(list["data"].as_array().map(Vec::len), Some(1));
        assert_eq!(list["data"][0]["id"], own["id"]);
        let balances: Value = app
            .get(api_key, "/ledger/balances")
            .await
            .json()
            .await
            .expect("balances");
        let receivable = balances["balances"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|b| b["account"] == "processor_receivable")
            .map(|b| b["balance"].clone());
        assert_eq!(receivable, Some(own["amount"].clone()));
        let inspected: Value = app
            .get(api_key, &format!("/idempotency-keys/{key}"))
            .await
            .json()
            .await
            .expect("key");
        assert_eq!(inspected["state"], "completed");
        let replay: Value = app
            .post_charge(
                api_key,
                &key,
                &visa(own["amount"].as_i64().unwrap_or_default()),
            )
            .await
            .json()
            .await
            .expect("replay");
        assert_eq!(replay["id"], own["id"], "a replay never crosses tenants");
    }
}

async fn oversized_headers_are_431_and_store_nothing(backend: Backend) {
    let app = spawn_app_with(backend, &[("PAYMENTS__SERVER__HEADER_LIMIT_BYTES", "4096")]).await;
    let response = app
        .charge(ACME, &new_key(), &visa(100))
        .header("X-Padding", "p".repeat(5_000))
        .send()
        .await
        .expect("send");
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (431, Some("headers_too_large"))
    );
    assert_eq!(app.footprint().await, Footprint::EMPTY);
}

async fn a_request_over_the_timeout_is_cut_off_and_its_charge_is_settled_later(backend: Backend) {
    let app = spawn_app_with(
        backend,
        &[
            ("PAYMENTS__SERVER__REQUEST_TIMEOUT_MS", "500"),
            ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "2"),
            ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "1500"),
            ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "1600"),
            ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "200"),
        ],
    )
    .await;
    let key = new_key();
    // tok_slow's charge exists at the processor two seconds after the call, whoever waits.
    let slow = json!({ "amount": 100, "currency": "usd", "source": "tok_slow" });
    let response = app.post_charge(ACME, &key, &slow).await;
    assert!(response.headers().get("retry-after").is_some());
    let (status, body) = problem(response).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("timeout")));

    // The timeout ended only the wait: the attempt went on, and its own processor call timed
    // out at 1.5 s, an unknown outcome. Nobody retries: once the settle grace has passed, the
    // completer finds the charge the processor made and records it; a later retry replays it.
    let mut settled = None;
    for _ in 0..100 {
        settled = app
            .record_state("acme", &key)
            .await
            .map(|(state, _, _)| state);
        if settled.as_deref() == Some("completed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(settled.as_deref(), Some("completed"));
    let replay = app.post_charge(ACME, &key, &slow).await;
    assert_eq!(replay.status().as_u16(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

/// Clients that hang up in the middle of their requests, at arbitrary points: while their body
/// is read, inside a claim's transaction (retries of keys that exist), between the statements
/// of a fresh charge. Their attempts run on without them (`clients_that_leave.rs`); whatever
/// each left behind, it must not be a connection stuck in a transaction: afterwards every new
/// charge goes through, and is there to be read.
async fn clients_hanging_up_mid_request_leave_the_store_usable(backend: Backend) {
    // Without Redis, so that every retry goes through the database's claim.
    let app = spawn_app_with(backend, &[("PAYMENTS__REDIS__URL", "")]).await;
    let existing: Vec<String> = (0..8).map(|_| new_key()).collect();
    for key in &existing {
        assert_eq!(
            app.post_charge(ACME, key, &visa(100))
                .await
                .status()
                .as_u16(),
            201
        );
    }
    for round in 0..150_u64 {
        let requests = (0..16_u64).map(|i| {
            // Most retry a key that exists (the claim's locking transaction), some are new.
            let key = if i % 4 != 0 {
                existing[i as usize % existing.len()].clone()
            } else {
                new_key()
            };
            app.charge(ACME, &key, &visa(100))
                .timeout(Duration::from_millis(1 + (round * 7 + i) % 8))
                .send()
        });
        // Most of these are cut off by their own timeout; whichever answer arrives is fine.
        let _ = join_all(requests).await;
    }
    // The attempts the clients left run on, each in its tenant's in-flight slot until it
    // ends, and on a busy machine they end after the clients are gone: every one must end.
    wait_for_in_flight(&app, 0).await;
    for _ in 0..20 {
        let response = app.post_charge(ACME, &new_key(), &visa(100)).await;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or_default();
        assert_eq!(status, 201, "a new charge after the hang-ups: {body}");
        let id = body["id"].as_str().unwrap_or_default();
        let read = app.get(ACME, &format!("/charges/{id}")).await;
        assert_eq!(
            read.status().as_u16(),
            200,
            "the charge {id} is stored for all to read"
        );
    }
}

on_every_backend!(
    clients_hanging_up_mid_request_leave_the_store_usable,
    json_nested_ten_thousand_deep_is_a_400_and_stores_nothing,
    a_body_that_stops_early_stores_nothing_and_leaves_the_key_free,
    a_client_stalling_mid_body_gets_408_and_holds_no_lock,
    control_characters_in_a_key_are_refused_before_the_service_stores_anything,
    beyond_the_in_flight_limit_requests_are_shed_with_503_and_retry_after,
    many_bad_requests_at_once_leave_the_service_serving,
    two_tenants_with_the_same_keys_never_see_each_others_data_on_any_endpoint,
    oversized_headers_are_431_and_store_nothing,
    a_request_over_the_timeout_is_cut_off_and_its_charge_is_settled_later,
);
