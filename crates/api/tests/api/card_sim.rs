//! The stand-alone `card-sim` processor as a separate process, so that it keeps its charges
//! (and its own idempotency keys) while the service is killed and restarted.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::helpers::{http_client, read_listening_address, workspace_binary};

pub(crate) struct CardSim {
    pub url: String,
    _child: Child,
}

impl CardSim {
    pub(crate) async fn start() -> Self {
        Self::start_with_latency_ms(0).await
    }

    /// Starts a simulator that adds `latency_ms` to every charge.
    pub(crate) async fn start_with_latency_ms(latency_ms: u64) -> Self {
        let mut child = Command::new(workspace_binary("card-sim"))
            .env_clear()
            .env("CARD_SIM_BIND", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .env("CARD_SIM_LATENCY_MS", latency_ms.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start card-sim");
        let address = read_listening_address(&mut child, "card-sim").await;
        Self {
            url: format!("http://{address}"),
            _child: child,
        }
    }

    /// Distinct charges the processor has ever created.
    pub(crate) async fn charges_created(&self) -> i64 {
        self.stat("charges_created").await
    }

    /// Distinct authorisations (holds) the processor has ever made.
    pub(crate) async fn authorizations_created(&self) -> i64 {
        self.stat("authorizations_created").await
    }

    /// Distinct captures of authorisations the processor has ever made.
    pub(crate) async fn captures_created(&self) -> i64 {
        self.stat("captures_created").await
    }

    /// Distinct voids of authorisations the processor has ever made.
    pub(crate) async fn voids_created(&self) -> i64 {
        self.stat("voids_created").await
    }

    /// Distinct refunds the processor has ever made.
    pub(crate) async fn refunds_created(&self) -> i64 {
        self.stat("refunds_created").await
    }

    /// Distinct payouts the processor has ever made.
    pub(crate) async fn payouts_created(&self) -> i64 {
        self.stat("payouts_created").await
    }

    /// Takes the line of `processor_id` out of every settlement report.
    pub(crate) async fn drop_from_report(&self, processor_id: &str) {
        self.testing("report/drop", json!({ "processor_id": processor_id }))
            .await;
    }

    /// Shows `amount` on the line of `processor_id` in every settlement report.
    pub(crate) async fn alter_in_report(&self, processor_id: &str, amount: i64) {
        self.testing(
            "report/alter",
            json!({ "processor_id": processor_id, "amount": amount }),
        )
        .await;
    }

    /// Makes a charge under `processor_key` that the service never asked for; returns its id.
    pub(crate) async fn unsolicited_charge(&self, processor_key: &str, amount: i64) -> String {
        let body = json!({
            "processor_key": processor_key, "amount": amount, "currency": "usd",
            "tenant": "acme", "resource_id": "ch_unknown",
        });
        let charge = self.testing("charges/unsolicited", body).await;
        charge["id"].as_str().expect("charge id").to_owned()
    }

    /// Captures `amount` of the authorisation `processor_charge_id` under `processor_key`, as
    /// another caller of the processor would, with no metadata: a capture the service never
    /// asked for. Returns the capture's id.
    pub(crate) async fn capture_unasked(
        &self,
        processor_charge_id: &str,
        processor_key: &str,
        amount: i64,
    ) -> String {
        let body = json!({ "charge": processor_charge_id, "amount": amount, "currency": "usd" });
        self.call_unasked("captures", processor_key, body).await
    }

    /// Voids the authorisation `processor_charge_id` under `processor_key`, as another caller of
    /// the processor would: a void the service never asked for. Returns the void's id.
    pub(crate) async fn void_unasked(
        &self,
        processor_charge_id: &str,
        processor_key: &str,
    ) -> String {
        let body = json!({ "charge": processor_charge_id });
        self.call_unasked("voids", processor_key, body).await
    }

    async fn call_unasked(&self, path: &str, processor_key: &str, body: Value) -> String {
        let response = http_client()
            .post(format!("{}/v1/{path}", self.url))
            .header("Idempotency-Key", processor_key)
            .json(&body)
            .send()
            .await
            .expect("card-sim call");
        let status = response.status();
        let made: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "card-sim {path}: {status} {made}");
        made["id"].as_str().expect("an id").to_owned()
    }

    async fn testing(&self, path: &str, body: Value) -> Value {
        let response = http_client()
            .post(format!("{}/v1/testing/{path}", self.url))
            .json(&body)
            .send()
            .await
            .expect("card-sim testing call");
        let status = response.status();
        assert!(status.is_success(), "card-sim {path}: {status}");
        response.json().await.unwrap_or(Value::Null)
    }

    async fn stat(&self, name: &str) -> i64 {
        let stats: Value = http_client()
            .get(format!("{}/v1/stats", self.url))
            .send()
            .await
            .expect("card-sim stats")
            .json()
            .await
            .expect("stats JSON");
        stats[name]
            .as_i64()
            .unwrap_or_else(|| panic!("{name} is a number in {stats}"))
    }
}
