//! A merchant's webhook consumer, on PostgreSQL or SQLite: `POST /webhooks` verifies the
//! delivery's signatures with the endpoint's secret (`payments_client::webhooks::Verifier`), then
//! applies the event exactly once.
//!
//! The payments service delivers every event at least once, and for days: the same event may
//! arrive twice at once (a retry racing a slow first attempt) or a day later (an answer that was
//! lost). So the consumer keeps the `webhook-id` of every event it applied, and inserts it in
//! the same transaction that applies the event: the insert that finds the id already there
//! means the event was applied, and the transaction changes nothing else. Two deliveries of one
//! event at once meet on the id's primary key; the second waits for the first and finds it.
//! Applying here is adding a payment to the merchant's totals, which would count twice without
//! the id.
//!
//! Answers: `200` once the event is applied or found applied (the service stops retrying);
//! `400` for a delivery that does not verify (a retry of it will not either; nothing applied);
//! `500` when the database fails (the service retries later).
//!
//! ```sh
//! WEBHOOK_SECRET=whsec_... WEBHOOK_DATABASE_URL=sqlite://receiver.db?mode=rwc \
//!     cargo run -p webhook-receiver-example     # prints: webhook-receiver listening on ...
//! ```

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use payments_client::webhooks::{Verifier, VerifyError};
use serde_json::{Value, json};
use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

/// The ids of the events applied, and the merchant's totals they were applied to: whole
/// statements, the same on PostgreSQL and SQLite.
const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS applied_webhooks (
         webhook_id  TEXT   PRIMARY KEY,
         event_type  TEXT   NOT NULL,
         applied_at  TEXT   NOT NULL
     )",
    "CREATE TABLE IF NOT EXISTS merchant_totals (
         currency  TEXT    PRIMARY KEY,
         payments  BIGINT  NOT NULL,
         amount    BIGINT  NOT NULL
     )",
];

/// Keeps the event's id; no row changed means it was applied before.
const KEEP_ID: &str = "
INSERT INTO applied_webhooks (webhook_id, event_type, applied_at) VALUES ($1, $2, $3)
ON CONFLICT (webhook_id) DO NOTHING";

/// Adds one payment of `$2` in `$1` to the totals.
const ADD_PAYMENT: &str = "
INSERT INTO merchant_totals (currency, payments, amount) VALUES ($1, 1, $2)
ON CONFLICT (currency) DO UPDATE
SET payments = merchant_totals.payments + 1, amount = merchant_totals.amount + excluded.amount";

#[derive(Clone)]
struct Receiver {
    verifier: Arc<Verifier>,
    db: AnyPool,
}

/// Why a delivery is refused: a `400` with a stable `code`.
fn refused(code: &str, detail: String) -> Response {
    let body = json!({
        "type": "about:blank", "title": "Bad Request", "status": 400, "code": code,
        "detail": detail,
    });
    let headers = [("content-type", "application/problem+json")];
    (StatusCode::BAD_REQUEST, headers, body.to_string()).into_response()
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    let now = chrono::Utc::now();
    let verified = match receiver.verifier.verify(&headers, &body, now) {
        Ok(verified) => verified,
        Err(error @ (VerifyError::TooOld | VerifyError::TooNew)) => {
            return refused("stale_timestamp", error.to_string());
        }
        Err(error) => return refused("invalid_signature", error.to_string()),
    };
    let Ok(event) = serde_json::from_slice::<Value>(&body) else {
        return refused("invalid_event", "the body is not a JSON event".into());
    };
    // The signature covers both; an event that is not the one its id names is not applied.
    if event["id"] != verified.webhook_id.as_str() {
        return refused(
            "invalid_event",
            "the event's id is not its webhook-id".into(),
        );
    }
    match apply(&receiver.db, &verified.webhook_id, &event).await {
        Ok(applied) => (StatusCode::OK, axum::Json(json!({ "applied": applied }))).into_response(),
        Err(error) => {
            eprintln!(
                "webhook-receiver: {} not applied: {error}",
                verified.webhook_id
            );
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Applies `event` once: `true` if this delivery applied it, `false` if an earlier one had.
async fn apply(db: &AnyPool, webhook_id: &str, event: &Value) -> Result<bool, sqlx::Error> {
    let event_type = event["type"].as_str().unwrap_or_default();
    let mut transaction = db.begin().await?;
    let kept = sqlx::query(KEEP_ID)
        .bind(webhook_id)
        .bind(event_type)
        .bind(chrono::Utc::now().to_rfc3339())
        .execute(&mut *transaction)
        .await?;
    if kept.rows_affected() == 0 {
        return Ok(false);
    }
    // An event this consumer does not act on is still kept as applied: it is acknowledged.
    if event_type == "payment.completed" {
        let payload = &event["payload"];
        let currency = payload["currency"].as_str().unwrap_or_default();
        let amount = payload["amount"].as_i64().unwrap_or_default();
        sqlx::query(ADD_PAYMENT)
            .bind(currency)
            .bind(amount)
            .execute(&mut *transaction)
            .await?;
    }
    transaction.commit().await?;
    Ok(true)
}

/// A setting from the environment; a start-up error names it.
fn setting(name: &str, default: Option<&str>) -> Result<String, String> {
    let value = std::env::var(name).ok().or(default.map(str::to_owned));
    value.ok_or(format!("{name} is not set"))
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let secret = setting("WEBHOOK_SECRET", None)?;
    let verifier = Verifier::new(&secret).map_err(|e| format!("WEBHOOK_SECRET: {e}"))?;
    let url = setting("WEBHOOK_DATABASE_URL", None)?;
    sqlx::any::install_default_drivers();
    // One SQLite connection: SQLite writes one at a time anyway.
    let connections = if url.starts_with("sqlite:") { 1 } else { 8 };
    let db = AnyPoolOptions::new()
        .max_connections(connections)
        .connect(&url)
        .await
        .map_err(|e| format!("WEBHOOK_DATABASE_URL: {e}"))?;
    for statement in SCHEMA {
        sqlx::query(statement)
            .execute(&db)
            .await
            .map_err(|e| format!("WEBHOOK_DATABASE_URL: the schema: {e}"))?;
    }
    let receiver = Receiver {
        verifier: Arc::new(verifier),
        db,
    };
    let router = axum::Router::new()
        .route("/webhooks", axum::routing::post(receive))
        .with_state(receiver);
    let listen = setting("WEBHOOK_LISTEN", Some("127.0.0.1:8070"))?;
    let listener = tokio::net::TcpListener::bind(&listen).await;
    let listener = listener.map_err(|e| format!("WEBHOOK_LISTEN {listen}: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    println!("webhook-receiver listening on {address}");
    axum::serve(listener, router)
        .await
        .map_err(|e| e.to_string())
}
