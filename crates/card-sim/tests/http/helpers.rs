//! `spawn_sim()`: one `card-sim` process per test, so tests run in parallel and count alone.

use std::process::Stdio;
use std::time::Duration;

use axum::http::{StatusCode, header};
use payments_card_sim::HttpCardProcessor;
use payments_domain::{
    Amount, CardProcessor, Currency, Destination, Money, PaymentSource, ProcessorCaptureRequest,
    ProcessorCharge, ProcessorChargeRequest, ProcessorError, ProcessorMetadata,
    ProcessorPayoutRequest, ProcessorRefund, ProcessorRefundRequest, ProcessorVoidRequest,
    TenantId,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Long enough for any call in these tests, except where a test sets its own.
pub(crate) const PATIENT: Duration = Duration::from_secs(30);

/// The latency of [`spawn_slow_sim`]: long enough to probe a charge in flight several times.
pub(crate) const LATENCY: Duration = Duration::from_millis(1500);

/// How long a request on the loopback is given to reach the simulator before a test probes
/// the key it registered. Far below [`LATENCY`], so the probes still find it processing.
pub(crate) const REACH: Duration = Duration::from_millis(300);

/// One kind of call the processor deduplicates by key, named as in its paths: the tests of the
/// protocol every kind keeps are written once and run on each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kind(&'static str);

pub(crate) const CHARGES: Kind = Kind("charges");
pub(crate) const REFUNDS: Kind = Kind("refunds");
pub(crate) const PAYOUTS: Kind = Kind("payouts");
pub(crate) const CAPTURES: Kind = Kind("captures");
pub(crate) const VOIDS: Kind = Kind("voids");

impl Kind {
    /// `POST` makes one, `GET ?idempotency_key=K` looks it up.
    pub(crate) fn path(self) -> String {
        format!("/v1/{}", self.0)
    }

    pub(crate) fn cancel_path(self) -> String {
        format!("/v1/{}/cancel", self.0)
    }

    /// Its count in `GET /v1/stats`.
    pub(crate) fn created_stat(self) -> String {
        format!("{}_created", self.0)
    }
}

/// A running `card-sim`; the process is killed when this is dropped.
pub(crate) struct TestSim {
    pub base_url: String,
    pub child: Child,
    http: reqwest::Client,
}

/// Starts `card-sim --bind 127.0.0.1:0` without latency.
pub(crate) async fn spawn_sim() -> TestSim {
    spawn_sim_with(&["--bind", "127.0.0.1:0"], &[]).await
}

/// Starts `card-sim` whose every new charge takes [`LATENCY`] to come into existence.
pub(crate) async fn spawn_slow_sim() -> TestSim {
    let latency = LATENCY.as_millis().to_string();
    spawn_sim_with(
        &["--bind", "127.0.0.1:0"],
        &[("CARD_SIM_LATENCY_MS", latency.as_str())],
    )
    .await
}

/// Starts `card-sim` with these arguments and extra environment variables.
pub(crate) async fn spawn_sim_with(args: &[&str], env: &[(&str, &str)]) -> TestSim {
    let mut child = Command::new(env!("CARGO_BIN_EXE_card-sim"))
        .args(args)
        // A clean environment, so a developer's CARD_SIM_* cannot change the outcome.
        .env_clear()
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start card-sim");
    let address = read_listening_address(&mut child).await;
    TestSim {
        base_url: format!("http://{address}"),
        child,
        http: reqwest::Client::builder()
            .timeout(PATIENT)
            .build()
            .expect("http client"),
    }
}

/// Reads stdout until the `listening address=` line, then keeps draining it so the pipe never
/// fills and blocks the server.
async fn read_listening_address(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let address = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split("listening address=").nth(1) {
                return rest.split_whitespace().next().map(str::to_owned);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("card-sim did not report a listening address (see its stderr above)");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    address
}

impl TestSim {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// A client of this simulator that gives up after `timeout`.
    pub(crate) fn processor(&self, timeout: Duration) -> HttpCardProcessor {
        HttpCardProcessor::new(&self.base_url, timeout).expect("build HttpCardProcessor")
    }

    /// A raw HTTP client, for what `HttpCardProcessor` never sends.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A patient client, and a `tok_visa` charge of `money` made through it.
    pub(crate) async fn charged(&self, money: Money) -> (HttpCardProcessor, ProcessorCharge) {
        let processor = self.processor(PATIENT);
        let request = ProcessorChargeRequest {
            money,
            ..request("order-1", "tok_visa")
        };
        let charge = processor.charge(request).await.expect("charge");
        (processor, charge)
    }

    /// A patient client, and a `tok_visa` authorisation of `money` made through it, under the
    /// key `auth-1`.
    pub(crate) async fn authorized(&self, money: Money) -> (HttpCardProcessor, ProcessorCharge) {
        let processor = self.processor(PATIENT);
        let request = ProcessorChargeRequest {
            money,
            ..request("auth-1", "tok_visa")
        };
        let authorization = processor.authorize(request).await.expect("authorize");
        (processor, authorization)
    }

    /// `POST` to the path that makes `kind`, with the `Idempotency-Key` if given: the status
    /// and the JSON body.
    pub(crate) async fn create(
        &self,
        kind: Kind,
        key: Option<&str>,
        body: &Value,
    ) -> (StatusCode, Value) {
        self.post(&kind.path(), key, Some(body)).await
    }

    /// `POST` to the cancel path of `kind`, with the `Idempotency-Key` if given.
    pub(crate) async fn cancel(&self, kind: Kind, key: Option<&str>) -> (StatusCode, Value) {
        self.post(&kind.cancel_path(), key, None).await
    }

    /// `GET` the lookup path of `kind` with `?idempotency_key=K`.
    pub(crate) async fn find(&self, kind: Kind, key: &str) -> (StatusCode, Value) {
        let request = self
            .http
            .get(self.url(&kind.path()))
            .query(&[("idempotency_key", key)]);
        answer(request.send().await.expect("GET by idempotency key")).await
    }

    /// `GET /v1/stats`: how many of `kind` the processor ever made.
    pub(crate) async fn created(&self, kind: Kind) -> u64 {
        self.stat(&kind.created_stat()).await
    }

    /// `POST /v1/charges`, with the `Idempotency-Key` if given: the status and the JSON body.
    pub(crate) async fn post_charge(&self, key: Option<&str>, body: &Value) -> (StatusCode, Value) {
        self.create(CHARGES, key, body).await
    }

    /// `POST /v1/charges/cancel`, with the `Idempotency-Key` if given.
    pub(crate) async fn post_cancel(&self, key: Option<&str>) -> (StatusCode, Value) {
        self.cancel(CHARGES, key).await
    }

    /// `GET /v1/stats`: distinct charges the processor ever created, authorisations included.
    pub(crate) async fn charges_created(&self) -> u64 {
        self.created(CHARGES).await
    }

    /// `GET /v1/stats`: distinct authorisations the processor ever made.
    pub(crate) async fn authorizations_created(&self) -> u64 {
        self.stat("authorizations_created").await
    }

    /// `GET /v1/stats`, all of it.
    pub(crate) async fn stats(&self) -> Value {
        self.http
            .get(self.url("/v1/stats"))
            .send()
            .await
            .expect("GET /v1/stats")
            .json()
            .await
            .expect("stats JSON")
    }

    /// `GET /v1/reports/settlement` with `query`: the status, the `Content-Type` and the body.
    pub(crate) async fn settlement_report(
        &self,
        query: &[(&str, &str)],
    ) -> (StatusCode, String, String) {
        let response = self
            .http
            .get(self.url("/v1/reports/settlement"))
            .query(query)
            .send()
            .await
            .expect("GET /v1/reports/settlement");
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        (status, content_type, response.text().await.expect("body"))
    }

    /// `POST /v1/testing/<path>` with `body`: the status, and the JSON body if there is one.
    pub(crate) async fn testing(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let response = self
            .http
            .post(self.url(&format!("/v1/testing/{path}")))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /v1/testing/{path}: {e}"));
        let status = response.status();
        let text = response.text().await.expect("body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
        };
        (status, body)
    }

    /// `POST path`, with the `Idempotency-Key` and the JSON body if given.
    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.post(self.url(path));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await;
        answer(response.unwrap_or_else(|e| panic!("POST {path}: {e}"))).await
    }

    async fn stat(&self, name: &str) -> u64 {
        let stats = self.stats().await;
        stats[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} in {stats}"))
    }
}

/// Waits until the processor has a charge under `key`: a charge exists only once its latency
/// has passed, whether or not its caller still waits. Polls with `find_charge`, which never
/// creates, and gives up after ten seconds.
pub(crate) async fn charge_appears(processor: &impl CardProcessor, key: &str) -> ProcessorCharge {
    appears(key, || processor.find_charge(key)).await
}

/// [`charge_appears`] for a refund, polling with `find_refund`.
pub(crate) async fn refund_appears(processor: &impl CardProcessor, key: &str) -> ProcessorRefund {
    appears(key, || processor.find_refund(key)).await
}

async fn appears<T, F>(key: &str, find: impl Fn() -> F) -> T
where
    F: Future<Output = Result<Option<T>, ProcessorError>>,
{
    let poll = async {
        loop {
            if let Ok(Some(found)) = find().await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .unwrap_or_else(|_| panic!("nothing under {key:?} at the processor"))
}

/// A 19.99 USD charge of `token` under `key`, whose metadata names `ch_<key>` of `acme`.
pub(crate) fn request(key: &str, token: &str) -> ProcessorChargeRequest {
    ProcessorChargeRequest {
        idempotency_key: key.to_owned(),
        money: usd(1999),
        source: PaymentSource::new(token).expect("valid token"),
        metadata: metadata(&format!("ch_{key}")),
    }
}

/// The metadata of the resource `resource_id` of the tenant `acme`.
pub(crate) fn metadata(resource_id: &str) -> ProcessorMetadata {
    ProcessorMetadata::new(TenantId::new("acme"), resource_id)
}

pub(crate) fn usd(minor_units: i64) -> Money {
    Money::new(
        Amount::new(minor_units).expect("valid amount"),
        Currency::Usd,
    )
}

/// The body of `POST /v1/charges` for 19.99 USD with `source`.
pub(crate) fn charge_body(source: &str) -> Value {
    json!({"amount": 1999, "currency": "USD", "source": source})
}

/// A refund of `money` of the processor's charge `charge_id` under `key`.
pub(crate) fn refund_request(key: &str, charge_id: &str, money: Money) -> ProcessorRefundRequest {
    ProcessorRefundRequest {
        idempotency_key: key.to_owned(),
        processor_charge_id: charge_id.to_owned(),
        money,
        metadata: metadata(&format!("re_{key}")),
    }
}

/// A capture of `money` of the processor's authorisation `charge_id` under `key`.
pub(crate) fn capture_request(key: &str, charge_id: &str, money: Money) -> ProcessorCaptureRequest {
    ProcessorCaptureRequest {
        idempotency_key: key.to_owned(),
        processor_charge_id: charge_id.to_owned(),
        money,
        metadata: metadata(&format!("cap_{key}")),
    }
}

/// A void of the processor's authorisation `charge_id` under `key`.
pub(crate) fn void_request(key: &str, charge_id: &str) -> ProcessorVoidRequest {
    ProcessorVoidRequest {
        idempotency_key: key.to_owned(),
        processor_charge_id: charge_id.to_owned(),
        metadata: metadata(&format!("void_{key}")),
    }
}

/// A payout of `money` to `destination` under `key`.
pub(crate) fn payout_request(key: &str, destination: &str, money: Money) -> ProcessorPayoutRequest {
    ProcessorPayoutRequest {
        idempotency_key: key.into(),
        money,
        destination: Destination::new(destination).unwrap_or_else(|e| panic!("{e}")),
        metadata: metadata(&format!("po_{key}")),
    }
}

pub(crate) fn payout_body(destination: &str, amount: i64) -> Value {
    json!({"amount": amount, "currency": "USD", "destination": destination})
}

/// The body of `POST /v1/refunds` for `amount` USD cents of the processor's charge `charge_id`.
pub(crate) fn refund_body(charge_id: &str, amount: i64) -> Value {
    json!({"charge": charge_id, "amount": amount, "currency": "USD"})
}

/// The body of `POST /v1/captures` for `amount` USD cents of the authorisation `charge_id`.
pub(crate) fn capture_body(charge_id: &str, amount: i64) -> Value {
    json!({"charge": charge_id, "amount": amount, "currency": "USD"})
}

/// The body of `POST /v1/voids` of the authorisation `charge_id`.
pub(crate) fn void_body(charge_id: &str) -> Value {
    json!({"charge": charge_id})
}

async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    (status, response.json().await.expect("JSON body"))
}

/// A processor that answers every request with `status` and `body`, whatever was asked: for
/// the answers `card-sim` never gives. Returns its base URL; it stops with the test's runtime.
pub(crate) async fn spawn_fake_processor(status: StatusCode, body: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let app = axum::Router::new().fallback(move || async move {
        (status, [(header::CONTENT_TYPE, "application/json")], body)
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}
