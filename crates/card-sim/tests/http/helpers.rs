//! `spawn_sim()`: one `card-sim` process per test, so tests run in parallel and count alone.

use std::process::Stdio;
use std::time::Duration;

use payments_card_sim::HttpCardProcessor;
use payments_domain::{
    Amount, CardProcessor, Currency, Money, PaymentSource, ProcessorCharge, ProcessorChargeRequest,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Long enough for any call in these tests, except where a test sets its own.
pub const PATIENT: Duration = Duration::from_secs(30);

/// A running `card-sim`; the process is killed when this is dropped.
pub struct TestSim {
    pub base_url: String,
    pub child: Child,
    http: reqwest::Client,
}

/// Starts `card-sim --bind 127.0.0.1:0` without latency.
pub async fn spawn_sim() -> TestSim {
    spawn_sim_with(&["--bind", "127.0.0.1:0"], &[]).await
}

/// Starts `card-sim` with these arguments and extra environment variables.
pub async fn spawn_sim_with(args: &[&str], env: &[(&str, &str)]) -> TestSim {
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
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// A client of this simulator that gives up after `timeout`.
    pub fn processor(&self, timeout: Duration) -> HttpCardProcessor {
        HttpCardProcessor::new(&self.base_url, timeout).expect("build HttpCardProcessor")
    }

    /// A raw HTTP client, for what `HttpCardProcessor` never sends.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `GET /v1/stats`: distinct charges the processor ever created.
    pub async fn charges_created(&self) -> u64 {
        let stats: serde_json::Value = self
            .http
            .get(self.url("/v1/stats"))
            .send()
            .await
            .expect("GET /v1/stats")
            .json()
            .await
            .expect("stats JSON");
        stats["charges_created"]
            .as_u64()
            .unwrap_or_else(|| panic!("no charges_created in {stats}"))
    }
}

/// Waits until the processor has a charge under `key`: the charge is recorded as soon as the
/// request reaches the simulator, but on a busy machine that can lag behind the client. Polls
/// with `find_charge`, which never creates, and gives up after ten seconds.
pub async fn charge_appears(processor: &impl CardProcessor, key: &str) -> ProcessorCharge {
    let poll = async {
        loop {
            if let Ok(Some(charge)) = processor.find_charge(key).await {
                return charge;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .unwrap_or_else(|_| panic!("no charge under {key:?} at the processor"))
}

/// A 19.99 USD charge of `token` under `key`.
pub fn request(key: &str, token: &str) -> ProcessorChargeRequest {
    ProcessorChargeRequest {
        idempotency_key: key.to_owned(),
        money: usd(1999),
        source: PaymentSource::new(token).expect("valid token"),
    }
}

pub fn usd(minor_units: i64) -> Money {
    Money::new(
        Amount::new(minor_units).expect("valid amount"),
        Currency::Usd,
    )
}
