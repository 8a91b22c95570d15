//! The example receiver as a process, over real HTTP, on PostgreSQL and SQLite: every event is
//! applied exactly once however often, and however concurrently, it is delivered; a delivery
//! that does not verify is refused and applies nothing.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use payments_webhooks::{Secret, signature_header};
use serde_json::{Value, json};
use sqlx::{AnyPool, Connection, PgConnection};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// The receiver, its database and the secret its endpoint signs with.
struct Receiver {
    url: String,
    secret: Secret,
    db: AnyPool,
    /// The PostgreSQL database to drop at the end.
    postgres: Option<String>,
    process: Child,
}

fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database of the test's own on `backend`: its URL, and its name on PostgreSQL.
async fn database(backend: &str) -> (String, Option<String>) {
    let name = format!("receiver_test_{}", Uuid::new_v4().simple());
    if backend == "sqlite" {
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let file = dir.join("receiver.db");
        return (format!("sqlite://{}?mode=rwc", file.display()), None);
    }
    let admin = admin_url();
    let mut connection = PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("{admin}: {e}"));
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("create database: {e}"));
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    (format!("{base}/{name}"), Some(name))
}

impl Receiver {
    async fn start(backend: &str) -> Self {
        sqlx::any::install_default_drivers();
        let (database_url, postgres) = database(backend).await;
        let secret = Secret::generate();
        let mut process = Command::new(env!("CARGO_BIN_EXE_webhook-receiver"))
            .env("WEBHOOK_SECRET", secret.expose())
            .env("WEBHOOK_DATABASE_URL", &database_url)
            .env("WEBHOOK_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start webhook-receiver: {e}"));
        let stdout = process.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        let read = stdout.read_line(&mut line);
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .unwrap_or_else(|_| panic!("webhook-receiver did not start"))
            .unwrap_or_else(|e| panic!("{e}"));
        let address = line
            .trim()
            .rsplit(' ')
            .next()
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        let db = AnyPool::connect(&database_url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            url: format!("http://{address}/webhooks"),
            secret,
            db,
            postgres,
            process,
        }
    }

    /// Stops the receiver and drops its PostgreSQL database.
    async fn finish(self) {
        self.db.close().await;
        drop(self.process);
        if let Some(name) = self.postgres {
            let mut connection = PgConnection::connect(&admin_url())
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .execute(&mut connection)
                .await
                .unwrap_or_else(|e| panic!("drop database: {e}"));
        }
    }

    /// Delivers `event` signed with `signature` (or the endpoint's own, when `None`) at
    /// `timestamp`: the answer's status and body.
    async fn deliver_signed(
        &self,
        event: &Value,
        timestamp: i64,
        signature: Option<&str>,
    ) -> (u16, Value) {
        let id = event["id"].as_str().unwrap_or_default();
        let body = event.to_string();
        let own = signature_header(&[&self.secret], id, timestamp, body.as_bytes());
        let answer = reqwest::Client::new()
            .post(&self.url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature.unwrap_or(&own))
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("deliver: {e}"));
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    async fn deliver(&self, event: &Value) -> (u16, Value) {
        self.deliver_signed(event, now(), None).await
    }

    /// (events applied, payments counted, amount counted).
    async fn applied(&self) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM applied_webhooks),
                    (SELECT CAST(coalesce(sum(payments), 0) AS BIGINT) FROM merchant_totals),
                    (SELECT CAST(coalesce(sum(amount), 0) AS BIGINT) FROM merchant_totals)",
        )
        .fetch_one(&self.db)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }
}

fn now() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_secs() as i64)
}

/// A `payment.completed` event as `GET /events` shows it.
fn payment(amount: i64) -> Value {
    let event_id = Uuid::new_v4();
    json!({
        "id": format!("evt_{event_id}"), "object": "event", "event_id": event_id,
        "type": "payment.completed", "created_at": "2026-12-07T09:00:00.000000Z",
        "payload": {
            "event_id": event_id, "schema_version": 1, "tenant": "acme",
            "charge_id": format!("ch_{}", Uuid::new_v4()), "amount": amount, "currency": "USD",
            "occurred_at": "2026-12-07T09:00:00.000000Z",
        },
    })
}

/// Five payments, each delivered ten times at once, then each once more later: every answer
/// 200, each applied by exactly one delivery, the totals counted once.
async fn every_event_is_applied_once_however_often_it_arrives(backend: &str) {
    let receiver = Receiver::start(backend).await;
    let events: Vec<Value> = (1..=5).map(|n| payment(n * 100)).collect();
    let deliveries = events
        .iter()
        .flat_map(|event| std::iter::repeat_n(event, 10))
        .map(|event| receiver.deliver(event));
    let answers = join_all(deliveries).await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    let applying = answers
        .iter()
        .filter(|(_, body)| body["applied"] == true)
        .count();
    assert_eq!(applying, 5, "one delivery of each event applies it");
    for event in &events {
        assert_eq!(
            receiver.deliver(event).await,
            (200, json!({ "applied": false }))
        );
    }
    assert_eq!(receiver.applied().await, (5, 5, 1_500));
    receiver.finish().await;
}

/// A delivery with another secret's signature, an empty or truncated one, a stale or future
/// timestamp, or a body that is not the event its id names: 400, and nothing applied.
async fn a_delivery_that_does_not_verify_applies_nothing(backend: &str) {
    let receiver = Receiver::start(backend).await;
    let event = payment(700);
    let id = event["id"].as_str().unwrap_or_default();
    let body = event.to_string();
    let stranger = Secret::generate().sign(id, now(), body.as_bytes());
    let own = receiver.secret.sign(id, now(), body.as_bytes());
    let truncated = &own[..own.len() - 4];
    for (signature, code) in [
        (stranger.as_str(), "invalid_signature"),
        ("", "invalid_signature"),
        ("v1,", "invalid_signature"),
        (truncated, "invalid_signature"),
    ] {
        let (status, problem) = receiver
            .deliver_signed(&event, now(), Some(signature))
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (400, Some(code)),
            "{signature:?}"
        );
    }
    for timestamp in [now() - 600, now() + 600] {
        let (status, problem) = receiver.deliver_signed(&event, timestamp, None).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (400, Some("stale_timestamp"))
        );
    }
    let mut renamed = event.clone();
    renamed["id"] = json!("evt_another");
    let signed = receiver
        .secret
        .sign(id, now(), renamed.to_string().as_bytes());
    let answer = reqwest::Client::new()
        .post(&receiver.url)
        .header("webhook-id", id)
        .header("webhook-timestamp", now().to_string())
        .header("webhook-signature", signed)
        .body(renamed.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.status().as_u16(), 400);
    assert_eq!(receiver.applied().await, (0, 0, 0));

    assert_eq!(receiver.deliver(&event).await.0, 200);
    assert_eq!(receiver.applied().await, (1, 1, 700));
    receiver.finish().await;
}

macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test] async fn $test() { super::$test("postgres").await })*
        }
        mod sqlite {
            $(#[tokio::test] async fn $test() { super::$test("sqlite").await })*
        }
    };
}

on_every_backend!(
    every_event_is_applied_once_however_often_it_arrives,
    a_delivery_that_does_not_verify_applies_nothing,
);
