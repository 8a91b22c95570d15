//! The charge flow's promises, one request sequence at a time.

use serde_json::{Value, json};

use crate::helpers::{
    ACME, Backend, Footprint, GLOBEX, TestDatabase, new_key, problem, snapshot, spawn_app, visa,
};

async fn first_request_creates_one_charge_with_its_ledger_transaction_and_event(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app.post_charge(ACME, &new_key(), &visa(1250)).await;

    assert_eq!(response.status().as_u16(), 201);
    assert!(
        response.headers().get("idempotent-replayed").is_none(),
        "a first execution is not a replay"
    );
    let location = response.headers()["location"]
        .to_str()
        .map(str::to_owned)
        .unwrap_or_default();
    let charge: Value = response.json().await.expect("charge JSON");
    assert_eq!(
        location,
        format!("/charges/{}", charge["id"].as_str().unwrap_or_default())
    );
    assert!(
        charge["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("ch_"))
    );
    assert_eq!(charge["object"], "charge");
    assert_eq!(charge["amount"], 1250);
    assert_eq!(charge["currency"], "USD");
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

async fn replay_returns_byte_identical_status_body_and_headers(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let headers = ["content-type", "location"];
    let first = snapshot(app.post_charge(ACME, &key, &visa(500)).await, &headers).await;

    for _ in 0..3 {
        let response = app.post_charge(ACME, &key, &visa(500)).await;
        assert_eq!(
            response
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
        assert_eq!(snapshot(response, &headers).await, first);
    }
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

async fn the_same_json_with_keys_in_another_order_and_spacing_replays(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let first = app
        .charge(ACME, &key, &json!({}))
        .body(r#"{"amount":700,"currency":"eur","source":"tok_mastercard"}"#)
        .send()
        .await
        .expect("first");
    assert_eq!(first.status().as_u16(), 201);
    let reordered = app
        .charge(ACME, &key, &json!({}))
        .body("{ \"source\" : \"tok_mastercard\",\n  \"currency\": \"eur\", \"amount\": 700 }")
        .send()
        .await
        .expect("reordered");
    assert_eq!(reordered.status().as_u16(), 201);
    assert_eq!(reordered.headers()["idempotent-replayed"], "true");
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

/// A request is compared by what it asks, not by how it is spelled: the currency in either case
/// and a description of `null` or none are the same charge, as they would be from another
/// schema version of the operation spelling its request its own way.
async fn the_same_charge_spelled_otherwise_replays(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let first = app
        .post_charge(
            ACME,
            &key,
            &json!({ "amount": 700, "currency": "EUR", "source": "tok_visa", "description": null }),
        )
        .await;
    assert_eq!(first.status().as_u16(), 201);
    let respelled = app
        .post_charge(
            ACME,
            &key,
            &json!({ "amount": 700, "currency": "eur", "source": "tok_visa" }),
        )
        .await;
    assert_eq!(respelled.status().as_u16(), 201);
    assert_eq!(respelled.headers()["idempotent-replayed"], "true");
    let (status, body) = problem(app.post_charge(ACME, &key, &visa(700)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "another currency"
    );
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

async fn a_quoted_structured_field_key_is_the_same_key_as_the_bare_token(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    assert_eq!(
        app.post_charge(ACME, &key, &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );
    let quoted = app
        .post_charge(ACME, &format!("\"{key}\""), &visa(100))
        .await;
    assert_eq!(quoted.status().as_u16(), 201);
    assert_eq!(quoted.headers()["idempotent-replayed"], "true");
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

async fn a_different_payload_under_a_used_key_is_422_and_executes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    assert_eq!(
        app.post_charge(ACME, &key, &visa(100))
            .await
            .status()
            .as_u16(),
        201
    );

    let (status, body) = problem(app.post_charge(ACME, &key, &visa(101)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    // The original is untouched and still replays.
    let replay = app.post_charge(ACME, &key, &visa(100)).await;
    assert_eq!(replay.status().as_u16(), 201);
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

async fn the_same_key_under_two_tenants_gives_two_independent_charges(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let acme: Value = app
        .post_charge(ACME, &key, &visa(100))
        .await
        .json()
        .await
        .expect("acme charge");
    let globex = app.post_charge(GLOBEX, &key, &visa(999)).await;
    assert_eq!(
        globex.status().as_u16(),
        201,
        "another tenant's key never collides"
    );
    assert!(globex.headers().get("idempotent-replayed").is_none());
    let globex: Value = globex.json().await.expect("globex charge");
    assert_ne!(acme["id"], globex["id"]);
    assert_eq!(globex["amount"], 999);
    assert_eq!(app.footprint().await, Footprint::charged(2));
}

async fn a_declined_card_is_stored_and_replayed_as_402(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let body = json!({ "amount": 100, "currency": "usd", "source": "tok_chargeDeclined" });
    let first = app.post_charge(ACME, &key, &body).await;
    let first_bytes = snapshot(first, &["content-type"]).await;
    assert_eq!(first_bytes.0, 402);
    let decline: Value = serde_json::from_slice(&first_bytes.2).expect("problem JSON");
    assert_eq!(decline["code"], "card_declined");
    assert_eq!(decline["decline_code"], "generic_decline");

    let replay = app.post_charge(ACME, &key, &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(snapshot(replay, &["content-type"]).await, first_bytes);

    assert_eq!(
        app.record_state("acme", &key).await,
        Some(("completed".into(), "finished".into(), 1))
    );
    assert_eq!(
        app.footprint().await,
        Footprint {
            records: 1,
            ..Footprint::EMPTY
        },
        "a decline moves no money"
    );
}

async fn a_processor_error_is_503_stores_no_response_and_every_retry_executes_again(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let body = json!({ "amount": 100, "currency": "usd", "source": "tok_processingError" });
    for attempt in 1..=2 {
        let response = app.post_charge(ACME, &key, &body).await;
        assert!(response.headers().get("retry-after").is_some());
        assert!(
            response.headers().get("idempotent-replayed").is_none(),
            "a 503 is never replayed"
        );
        let (status, problem) = problem(response).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (503, Some("processor_unavailable"))
        );
        // Nothing final is stored: the record waits, unlocked, for a retry or the completer
        // (which may have marked it failed already), and each retry was a new attempt.
        let (state, point, attempts) = app.record_state("acme", &key).await.expect("record");
        assert!(state == "pending" || state == "failed", "{state}");
        assert_eq!(point, "started");
        assert!(attempts >= attempt, "attempts {attempts}");
    }
    let stored: Option<i16> = sqlx::query_scalar("SELECT response_status FROM idempotency_records")
        .fetch_one(app.db())
        .await
        .expect("record");
    assert_eq!(stored, None);
    assert_eq!(
        app.footprint().await,
        Footprint {
            records: 1,
            ..Footprint::EMPTY
        }
    );
}

async fn after_a_transient_processor_error_a_retry_with_the_same_key_succeeds_once(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let body = json!({ "amount": 4200, "currency": "gbp", "source": "tok_processingErrorOnce" });

    assert_eq!(
        app.post_charge(ACME, &key, &body).await.status().as_u16(),
        503
    );
    assert_eq!(
        app.footprint().await,
        Footprint {
            records: 1,
            ..Footprint::EMPTY
        }
    );

    let retry = app.post_charge(ACME, &key, &body).await;
    assert_eq!(retry.status().as_u16(), 201);
    assert!(
        retry.headers().get("idempotent-replayed").is_none(),
        "the retry executed"
    );
    let replay = app.post_charge(ACME, &key, &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let (state, point, _) = app.record_state("acme", &key).await.expect("record");
    assert_eq!((state.as_str(), point.as_str()), ("completed", "finished"));
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

async fn a_failed_key_still_refuses_a_different_payload(backend: Backend) {
    // After a transient failure the processor may hold a charge under this key's processor
    // key; a different payload must not reuse it.
    let app = spawn_app(backend).await;
    let key = new_key();
    let body = json!({ "amount": 100, "currency": "usd", "source": "tok_processingError" });
    assert_eq!(
        app.post_charge(ACME, &key, &body).await.status().as_u16(),
        503
    );
    let (status, problem) = problem(app.post_charge(ACME, &key, &visa(100)).await).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
}

/// A charge the processor answers at once costs two commits: the claim inserts the record and
/// the finish completes it. No recovery point is written in between (the processor key finds
/// the charge for whoever resumes an attempt that died before its finish).
async fn a_first_charge_writes_its_record_twice_the_claim_and_the_finish(backend: Backend) {
    let app = spawn_app(backend).await;
    count_record_writes(&app.database).await;

    let response = app.post_charge(ACME, &new_key(), &visa(1250)).await;
    assert_eq!(response.status().as_u16(), 201);

    let writes: Vec<String> = sqlx::query_scalar("SELECT op FROM record_writes ORDER BY seq")
        .fetch_all(&app.database.pool)
        .await
        .expect("read the record writes");
    assert_eq!(writes, ["INSERT", "UPDATE"]);
}

/// Makes the database log every write of a row of `idempotency_records` in `record_writes`.
async fn count_record_writes(db: &TestDatabase) {
    let statements: &[&str] = match db.backend {
        Backend::Postgres => &[
            "CREATE TABLE record_writes (seq bigserial PRIMARY KEY, op text NOT NULL)",
            "CREATE FUNCTION log_record_write() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO record_writes (op) VALUES (TG_OP); RETURN NULL; END $$",
            "CREATE TRIGGER log_record_writes AFTER INSERT OR UPDATE ON idempotency_records
             FOR EACH ROW EXECUTE FUNCTION log_record_write()",
        ],
        Backend::Sqlite => &[
            "CREATE TABLE record_writes (seq INTEGER PRIMARY KEY, op TEXT NOT NULL)",
            "CREATE TRIGGER log_record_inserts AFTER INSERT ON idempotency_records
             BEGIN INSERT INTO record_writes (op) VALUES ('INSERT'); END",
            "CREATE TRIGGER log_record_updates AFTER UPDATE ON idempotency_records
             BEGIN INSERT INTO record_writes (op) VALUES ('UPDATE'); END",
        ],
    };
    for statement in statements {
        sqlx::query(statement)
            .execute(&db.pool)
            .await
            .expect("install the write log");
    }
}

on_every_backend!(
    a_first_charge_writes_its_record_twice_the_claim_and_the_finish,
    first_request_creates_one_charge_with_its_ledger_transaction_and_event,
    replay_returns_byte_identical_status_body_and_headers,
    the_same_json_with_keys_in_another_order_and_spacing_replays,
    the_same_charge_spelled_otherwise_replays,
    a_quoted_structured_field_key_is_the_same_key_as_the_bare_token,
    a_different_payload_under_a_used_key_is_422_and_executes_nothing,
    the_same_key_under_two_tenants_gives_two_independent_charges,
    a_declined_card_is_stored_and_replayed_as_402,
    a_processor_error_is_503_stores_no_response_and_every_retry_executes_again,
    after_a_transient_processor_error_a_retry_with_the_same_key_succeeds_once,
    a_failed_key_still_refuses_a_different_payload,
);
