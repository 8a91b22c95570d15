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

use chrono::{DateTime, NaiveDateTime, Utc};
use futures::future::join_all;
use reqwest::header::HeaderMap;
use reqwest::{Client, RequestBuilder, Response};
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

    /// A `POST` of `body` to `path` under the idempotency key `key`, ready to send (or to add
    /// a header to first).
    fn idempotent_post(
        &self,
        api_key: &str,
        path: &str,
        key: &str,
        body: &Value,
    ) -> RequestBuilder {
        self.client
            .post(self.url(path))
            .bearer_auth(api_key)
            .header("Idempotency-Key", key)
            .json(body)
    }

    async fn charge(&self, api_key: &str, key: &str, body: &Value) -> Response {
        self.idempotent_post(api_key, "/charges", key, body)
            .send()
            .await
            .expect("POST /charges")
    }

    async fn refund(&self, api_key: &str, charge: &str, key: &str, body: &Value) -> Response {
        self.idempotent_post(api_key, &format!("/charges/{charge}/refunds"), key, body)
            .send()
            .await
            .expect("POST /charges/{id}/refunds")
    }

    async fn payout(&self, api_key: &str, key: &str, body: &Value) -> Response {
        self.idempotent_post(api_key, "/payouts", key, body)
            .send()
            .await
            .expect("POST /payouts")
    }

    /// A charge of `amount` that succeeds, under a fresh key: its id.
    async fn charged(&self, api_key: &str, amount: i64, description: &str) -> String {
        let body = charge_body(amount, "tok_visa", description);
        let created = answer(self.charge(api_key, &unique("key"), &body).await).await;
        assert_eq!(created.status, 201, "{}", created.text());
        created.json()["id"].as_str().expect("charge id").to_owned()
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

    /// The tenant's objects carrying `description` among the newest 100 of the list at
    /// `list_path` (`/charges`, `/payouts`).
    async fn described(&self, api_key: &str, list_path: &str, description: &str) -> Vec<Value> {
        let (status, list) = self
            .get_json(api_key, &format!("{list_path}?limit=100"))
            .await;
        assert_eq!(status, 200, "{list}");
        list["data"]
            .as_array()
            .map(|objects| {
                objects
                    .iter()
                    .filter(|o| o["description"] == description)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// This tenant's charges carrying `description`, from the newest 100.
    async fn charges_described(&self, api_key: &str, description: &str) -> Vec<Value> {
        self.described(api_key, "/charges", description).await
    }

    /// Returns once the tenant's charge key `key` is held by an attempt in flight, as key
    /// inspection shows it (`pending`, locked); panics if it completes first or if that does
    /// not happen within ten seconds. A duplicate sent right after meets the attempt in flight.
    async fn until_in_flight(&self, api_key: &str, key: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (status, record) = self
                .get_json(api_key, &format!("/idempotency-keys/{key}"))
                .await;
            if status == 200 {
                assert_eq!(
                    record["state"], "pending",
                    "the first attempt was seen in flight before it finished: {record}"
                );
                if !record["locked_until"].is_null() {
                    return;
                }
            } else {
                assert_eq!(status, 404, "{record}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the key was not claimed within ten seconds"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends `first` and, once its charge key `key` is in flight, `duplicate`: the first's
    /// answer and what the duplicate gives.
    async fn with_a_duplicate_in_flight<D: Future>(
        &self,
        api_key: &str,
        key: &str,
        first: impl Future<Output = Response>,
        duplicate: D,
    ) -> (Answer, D::Output) {
        let first = async { answer(first.await).await };
        let duplicate = async {
            self.until_in_flight(api_key, key).await;
            duplicate.await
        };
        tokio::join!(first, duplicate)
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

/// A fresh name: a UUID spelt in the letters `a` to `p`, so that it never holds digits a
/// description would be refused for (a run of them can pass for a card number).
fn unique(prefix: &str) -> String {
    let letters: String = uuid::Uuid::new_v4()
        .simple()
        .to_string()
        .chars()
        .filter_map(|c| c.to_digit(16))
        .map(|nibble| char::from(b'a' + nibble as u8))
        .collect();
    format!("e2e-{prefix}-{letters}")
}

fn charge_body(amount: i64, source: &str, description: &str) -> Value {
    json!({ "amount": amount, "currency": "usd", "source": source, "description": description })
}

/// A response read in full: its status, headers and body bytes.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `Idempotent-Replayed`, which only a replay carries.
    fn replayed(&self) -> Option<&str> {
        self.header("idempotent-replayed")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: a JSON body, not {}", self.text()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// This answer is a replay of `first`: 201, marked replayed, the same bytes.
    fn assert_replays(&self, first: &Answer) {
        assert_eq!(
            (self.status, self.replayed()),
            (201, Some("true")),
            "the retry is a replay: {}",
            self.text()
        );
        assert_eq!(
            self.body, first.body,
            "a replay is byte for byte the first answer"
        );
    }
}

async fn answer(response: Response) -> Answer {
    Answer {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("body").to_vec(),
    }
}

async fn parts(response: Response) -> (u16, Option<String>, Vec<u8>) {
    let answer = answer(response).await;
    let replayed = answer.replayed().map(str::to_owned);
    (answer.status, replayed, answer.body)
}

/// The format of an HTTP date (RFC 9110's IMF-fixdate), as `Idempotency-Key-Expires` carries it.
const IMF_FIXDATE: &str = "%a, %d %b %Y %H:%M:%S GMT";

/// `value` read as an IMF-fixdate, which it must be exactly (written back, the same string).
fn imf_fixdate(value: &str) -> DateTime<Utc> {
    let at = NaiveDateTime::parse_from_str(value, IMF_FIXDATE)
        .unwrap_or_else(|e| panic!("{value:?} is not an IMF-fixdate: {e}"))
        .and_utc();
    assert_eq!(
        at.format(IMF_FIXDATE).to_string(),
        value,
        "an exact IMF-fixdate"
    );
    at
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
    assert_eq!(target.charges_described(ACME, &description).await.len(), 1);
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
        target.charges_described(ACME, &description).await.len(),
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
    let charges = target.charges_described(ACME, &description).await;
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
    assert!(
        target
            .charges_described(ACME, &description)
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn bad_input_is_a_problem_and_does_not_consume_the_key() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("invalid"));
    let bad = target
        .charge(ACME, &key, &charge_body(-5, "tok_visa", &description))
        .await;
    let bad = answer(bad).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("content-type"), Some("application/problem+json"));
    let problem = bad.json();
    assert_eq!(problem["status"], 400, "{problem}");
    assert_eq!(
        problem["code"], "invalid_request",
        "the stable code a client switches on: {problem}"
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

#[tokio::test]
async fn a_refund_is_made_once_and_its_retry_replays_it() {
    let target = Target::get().await;
    let charge = target.charged(ACME, 2500, &unique("refunded")).await;
    let key = unique("refund");
    let body = json!({ "amount": 1000, "reason": "requested_by_customer" });

    let first = answer(target.refund(ACME, &charge, &key, &body).await).await;
    assert_eq!(
        (first.status, first.replayed()),
        (201, None),
        "{}",
        first.text()
    );
    let refund = first.json();
    let id = refund["id"].as_str().expect("refund id");
    assert_eq!(
        (&refund["charge"], &refund["amount"], &refund["status"]),
        (&json!(charge), &json!(1000), &json!("succeeded"))
    );
    assert_eq!(
        first.header("location"),
        Some(format!("/refunds/{id}").as_str())
    );

    let again = answer(target.refund(ACME, &charge, &key, &body).await).await;
    again.assert_replays(&first);
    assert_eq!(again.header("location"), first.header("location"));

    let (status, refunds) = target
        .get_json(ACME, &format!("/charges/{charge}/refunds"))
        .await;
    assert_eq!(status, 200, "{refunds}");
    assert_eq!(
        refunds["data"],
        json!([refund]),
        "exactly one refund of the charge, the one answered"
    );
    let (status, refunded) = target.get_json(ACME, &format!("/charges/{charge}")).await;
    assert_eq!(status, 200, "{refunded}");
    assert_eq!(
        refunded["amount_refunded"], 1000,
        "refunded once, not twice"
    );
}

#[tokio::test]
async fn a_201_and_its_replay_say_until_when_the_key_replays_it() {
    let target = Target::get().await;
    let key = unique("key");
    let body = charge_body(400, "tok_visa", &unique("expires"));
    let first = answer(target.charge(ACME, &key, &body).await).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let again = answer(target.charge(ACME, &key, &body).await).await;
    again.assert_replays(&first);

    let expires = first
        .header("idempotency-key-expires")
        .expect("Idempotency-Key-Expires on the 201");
    assert_eq!(
        again.header("idempotency-key-expires"),
        Some(expires),
        "the same on the replay"
    );
    let at = imf_fixdate(expires);
    let from_now = at - Utc::now();
    assert!(
        from_now > chrono::Duration::zero() && from_now <= chrono::Duration::hours(24),
        "within the 24 hours of retention from now: {expires} is {from_now} away"
    );
    let (status, record) = target
        .get_json(ACME, &format!("/idempotency-keys/{key}"))
        .await;
    assert_eq!(status, 200, "{record}");
    let inspected =
        DateTime::parse_from_rfc3339(record["expires_at"].as_str().expect("expires_at"))
            .expect("an RFC 3339 time")
            .with_timezone(&Utc);
    assert_eq!(
        inspected.format(IMF_FIXDATE).to_string(),
        expires,
        "the header and key inspection name the same time"
    );
}

#[tokio::test]
async fn a_duplicate_of_a_charge_in_flight_gets_409_with_a_retry_after_of_seconds() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("in-flight"));
    let body = charge_body(800, "tok_slow", &description);
    let (first, duplicate) = target
        .with_a_duplicate_in_flight(ACME, &key, target.charge(ACME, &key, &body), async {
            answer(target.charge(ACME, &key, &body).await).await
        })
        .await;

    assert_eq!(duplicate.status, 409, "{}", duplicate.text());
    assert_eq!(
        duplicate.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(duplicate.json()["code"], "idempotency_key_in_use");
    let retry_after = duplicate
        .header("retry-after")
        .expect("Retry-After on the 409");
    let seconds: u64 = retry_after
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is whole seconds, not {retry_after:?}"));
    assert!(
        (1..=5).contains(&seconds),
        "when a 2 s charge is likely done, not the 30 s lock: Retry-After {seconds}"
    );

    assert_eq!(
        (first.status, first.replayed()),
        (201, None),
        "{}",
        first.text()
    );
    let retry = answer(target.charge(ACME, &key, &body).await).await;
    retry.assert_replays(&first);
    let charges = target.charges_described(ACME, &description).await;
    assert_eq!(charges.len(), 1, "exactly one charge for the key");
    assert_eq!(charges[0]["id"], first.json()["id"]);
}

#[tokio::test]
async fn a_duplicate_that_prefers_to_wait_gets_the_first_answer_instead_of_409() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("prefer-wait"));
    let body = charge_body(900, "tok_slow", &description);
    let duplicates = async {
        // The same duplicate without the preference shows the first still in flight.
        let impatient = answer(target.charge(ACME, &key, &body).await).await;
        let patient = target
            .idempotent_post(ACME, "/charges", &key, &body)
            .header("Prefer", "wait=10")
            .send()
            .await
            .expect("POST /charges with Prefer: wait");
        (impatient, answer(patient).await)
    };
    let (first, (impatient, patient)) = target
        .with_a_duplicate_in_flight(ACME, &key, target.charge(ACME, &key, &body), duplicates)
        .await;

    assert_eq!(impatient.status, 409, "{}", impatient.text());
    assert_eq!(
        (first.status, first.replayed()),
        (201, None),
        "{}",
        first.text()
    );
    assert_eq!(
        (patient.status, patient.replayed()),
        (201, Some("true")),
        "it waited for the first attempt: {}",
        patient.text()
    );
    assert_eq!(
        patient.body, first.body,
        "and got its answer, byte for byte"
    );
    assert_eq!(
        patient.header("preference-applied"),
        None,
        "the contract sends no Preference-Applied"
    );
    assert_eq!(target.charges_described(ACME, &description).await.len(), 1);
}

#[tokio::test]
async fn another_tenants_use_of_the_same_key_is_another_key() {
    let target = Target::get().await;
    let (key, description) = (unique("key"), unique("tenants"));
    let body = charge_body(600, "tok_visa", &description);
    let acme = answer(target.charge(ACME, &key, &body).await).await;
    let globex = answer(target.charge(GLOBEX, &key, &body).await).await;
    for (tenant, created) in [("acme", &acme), ("globex", &globex)] {
        assert_eq!(
            (created.status, created.replayed()),
            (201, None),
            "{tenant}: {}",
            created.text()
        );
    }
    let (acme_id, globex_id) = (acme.json()["id"].clone(), globex.json()["id"].clone());
    assert_ne!(acme_id, globex_id, "two charges, one per tenant");

    for (api_key, created, id) in [(ACME, &acme, &acme_id), (GLOBEX, &globex, &globex_id)] {
        let charges = target.charges_described(api_key, &description).await;
        assert_eq!(charges.len(), 1, "one charge for each tenant's key");
        assert_eq!(&charges[0]["id"], id);
        let retry = answer(target.charge(api_key, &key, &body).await).await;
        retry.assert_replays(created);
    }
    let (status, _) = target
        .get_json(
            GLOBEX,
            &format!("/charges/{}", acme_id.as_str().expect("id")),
        )
        .await;
    assert_eq!(status, 404, "globex cannot read acme's charge");
}

#[tokio::test]
async fn a_payout_is_made_once_and_its_retry_replays_it() {
    let target = Target::get().await;
    // Funded by this test itself, and far beyond its payout, so that whatever other clients
    // of the tenant pay out meanwhile cannot leave too little for it.
    target.charged(ACME, 1_000_000, &unique("funding")).await;
    let (key, description) = (unique("payout"), unique("payout"));
    let body = json!({
        "amount": 1500,
        "currency": "usd",
        "destination": "ba_checking",
        "description": description,
    });

    let first = answer(target.payout(ACME, &key, &body).await).await;
    assert_eq!(
        (first.status, first.replayed()),
        (201, None),
        "{}",
        first.text()
    );
    let payout = first.json();
    let id = payout["id"].as_str().expect("payout id");
    assert_eq!(
        (&payout["amount"], &payout["currency"], &payout["status"]),
        (&json!(1500), &json!("USD"), &json!("paid"))
    );
    assert_eq!(
        first.header("location"),
        Some(format!("/payouts/{id}").as_str())
    );

    let again = answer(target.payout(ACME, &key, &body).await).await;
    again.assert_replays(&first);

    let payouts = target.described(ACME, "/payouts", &description).await;
    assert_eq!(
        payouts,
        [payout],
        "exactly one payout for the key, the one answered"
    );
}
