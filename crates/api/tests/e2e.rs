//! End-to-end tests over HTTP alone, for a service running anywhere.
//!
//! With `E2E_BASE_URL` set (the compose stack's `e2e` profile sets it to its payments-api),
//! every test runs against that service. Without it, each test starts the embedded service
//! (SQLite, in-process simulator) in an empty directory of its own, so this suite also runs,
//! and can fail, in `scripts/test.sh`. The tests share the demo tenants with whatever else
//! uses the service, so every assertion is about the test's own keys and charges: a fresh
//! idempotency key and a description no other request carries.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures::future::join_all;
use reqwest::{Client, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const ACME: &str = "sk_test_acme";
const GLOBEX: &str = "sk_test_globex";

/// The service under test, and what this suite started for it (if anything).
struct Target {
    base_url: String,
    client: Client,
    _embedded: Option<Embedded>,
}

struct Embedded {
    _child: Child,
    dir: PathBuf,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Target {
    async fn get() -> Self {
        let client = Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("http client");
        if let Ok(base_url) = std::env::var("E2E_BASE_URL") {
            return Self {
                base_url: base_url.trim_end_matches('/').to_owned(),
                client,
                _embedded: None,
            };
        }
        let dir =
            std::env::temp_dir().join(format!("payments-e2e-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("working directory");
        let mut child = Command::new(env!("CARGO_BIN_EXE_payments-api"))
            .current_dir(&dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PAYMENTS__SERVER__BIND", "127.0.0.1:0")
            .env("PAYMENTS__SERVER__METRICS_BIND", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start payments-api");
        let address = listening_address(&mut child).await;
        Self {
            base_url: format!("http://{address}"),
            client,
            _embedded: Some(Embedded { _child: child, dir }),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    async fn charge(&self, api_key: &str, key: &str, body: &Value) -> Response {
        self.client
            .post(self.url("/charges"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("POST /charges")
    }

    async fn get_json(&self, api_key: &str, path: &str) -> (u16, Value) {
        let response = self
            .client
            .get(self.url(path))
            .bearer_auth(api_key)
            .send()
            .await
            .expect("GET");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// This tenant's charges carrying `description`, from the newest 100.
    async fn charges_described(&self, description: &str) -> Vec<Value> {
        let (status, list) = self.get_json(ACME, "/charges?limit=100").await;
        assert_eq!(status, 200, "{list}");
        list["data"]
            .as_array()
            .map(|charges| {
                charges
                    .iter()
                    .filter(|c| c["description"] == description)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Reads the service's log until it says where it listens, then keeps draining it.
async fn listening_address(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let address = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("listening")
                && let Some(rest) = line.split("address=").nth(1)
            {
                return rest.split_whitespace().next().map(str::to_owned);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("payments-api reported a listening address");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    address
}

fn unique(prefix: &str) -> String {
    format!("e2e-{prefix}-{}", uuid::Uuid::new_v4())
}

fn charge_body(amount: i64, source: &str, description: &str) -> Value {
    json!({ "amount": amount, "currency": "usd", "source": source, "description": description })
}

async fn parts(response: Response) -> (u16, Option<String>, Vec<u8>) {
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (
        status,
        replayed,
        response.bytes().await.expect("body").to_vec(),
    )
}

#[tokio::test]
async fn a_retry_replays_the_same_bytes_and_charges_once() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("retry"));
    let body = charge_body(2500, "tok_visa", &description);
    let (status, replayed, first) = parts(target.charge(ACME, &key, &body).await).await;
    assert_eq!(
        (status, replayed),
        (201, None),
        "{}",
        String::from_utf8_lossy(&first)
    );
    for _ in 0..3 {
        let (status, replayed, again) = parts(target.charge(ACME, &key, &body).await).await;
        assert_eq!((status, replayed.as_deref()), (201, Some("true")));
        assert_eq!(again, first, "a replay is byte for byte the first response");
    }
    let charge: Value = serde_json::from_slice(&first).expect("charge JSON");
    let id = charge["id"].as_str().expect("charge id");
    let (status, fetched) = target.get_json(ACME, &format!("/charges/{id}")).await;
    assert_eq!((status, &fetched), (200, &charge));
    assert_eq!(target.charges_described(&description).await.len(), 1);
}

#[tokio::test]
async fn concurrent_duplicates_make_exactly_one_charge() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("concurrent"));
    let body = charge_body(700, "tok_visa", &description);
    let answers = join_all((0..20).map(|_| target.charge(ACME, &key, &body))).await;
    let mut created = Vec::new();
    for answer in answers {
        let (status, _, bytes) = parts(answer).await;
        match status {
            201 => created.push(bytes),
            409 => {}
            other => panic!("a duplicate gets 201 or 409, not {other}"),
        }
    }
    assert!(
        !created.is_empty(),
        "at least the first attempt answered 201"
    );
    assert!(
        created.windows(2).all(|pair| pair[0] == pair[1]),
        "every 201 is the same charge"
    );
    assert_eq!(
        target.charges_described(&description).await.len(),
        1,
        "exactly one charge exists for twenty duplicates"
    );
}

#[tokio::test]
async fn another_payload_under_a_used_key_is_refused_and_executes_nothing() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("mismatch"));
    let first = target
        .charge(ACME, &key, &charge_body(1000, "tok_visa", &description))
        .await;
    assert_eq!(first.status().as_u16(), 201);
    let other = target
        .charge(ACME, &key, &charge_body(9900, "tok_visa", &description))
        .await;
    assert_eq!(other.status().as_u16(), 422);
    let problem: Value = other.json().await.expect("problem JSON");
    assert_eq!(problem["code"], "idempotency_key_reused");
    let charges = target.charges_described(&description).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["amount"], 1000);
}

#[tokio::test]
async fn a_decline_is_final_and_replayed_as_the_same_402() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("decline"));
    let body = charge_body(1500, "tok_chargeDeclined", &description);
    let (status, replayed, first) = parts(target.charge(ACME, &key, &body).await).await;
    assert_eq!((status, replayed), (402, None));
    let (status, replayed, again) = parts(target.charge(ACME, &key, &body).await).await;
    assert_eq!((status, replayed.as_deref()), (402, Some("true")));
    assert_eq!(again, first);
    let problem: Value = serde_json::from_slice(&first).expect("problem JSON");
    assert_eq!(problem["code"], "card_declined");
    assert!(target.charges_described(&description).await.is_empty());
}

#[tokio::test]
async fn bad_input_is_a_problem_and_does_not_consume_the_key() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("invalid"));
    let bad = target
        .charge(ACME, &key, &charge_body(-5, "tok_visa", &description))
        .await;
    assert_eq!(bad.status().as_u16(), 400);
    assert_eq!(
        bad.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let good = target
        .charge(ACME, &key, &charge_body(500, "tok_visa", &description))
        .await;
    assert_eq!(
        good.status().as_u16(),
        201,
        "the key was not used up by the bad request"
    );
}

#[tokio::test]
async fn a_key_is_inspectable_by_its_tenant_only() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("inspect"));
    let created = target
        .charge(ACME, &key, &charge_body(300, "tok_visa", &description))
        .await;
    assert_eq!(created.status().as_u16(), 201);
    let (status, record) = target
        .get_json(ACME, &format!("/idempotency-keys/{key}"))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["state"], "completed");
    assert_eq!(record["response_status"], 201);
    let (status, _) = target
        .get_json(GLOBEX, &format!("/idempotency-keys/{key}"))
        .await;
    assert_eq!(status, 404, "another tenant cannot see the key");
}
