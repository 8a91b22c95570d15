//! The stand-alone `card-sim` processor as a separate process, so that it keeps its charges
//! (and its own idempotency keys) while the service is killed and restarted.

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::Value;
use tokio::process::{Child, Command};

use crate::helpers::{http_client, read_listening_address};

pub(crate) struct CardSim {
    pub url: String,
    _child: Child,
}

/// The `card-sim` binary, built beside `payments-api` by `cargo test --workspace`.
fn binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_payments-api")).with_file_name("card-sim");
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo test --workspace)",
        path.display()
    );
    path
}

impl CardSim {
    pub(crate) async fn start() -> Self {
        Self::start_with_latency_ms(0).await
    }

    /// Starts a simulator that adds `latency_ms` to every charge.
    pub(crate) async fn start_with_latency_ms(latency_ms: u64) -> Self {
        let mut child = Command::new(binary())
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

    /// Distinct refunds the processor has ever made.
    pub(crate) async fn refunds_created(&self) -> i64 {
        self.stat("refunds_created").await
    }

    /// Distinct payouts the processor has ever made.
    pub(crate) async fn payouts_created(&self) -> i64 {
        self.stat("payouts_created").await
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
