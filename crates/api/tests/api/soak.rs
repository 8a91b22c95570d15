//! The kill -9 soak: clients charge fresh keys through two instances, retrying each key until
//! it settles, while instances are SIGKILLed and restarted at random every 1 to 3 seconds.
//! At the end every key answered exactly one charge id, and the processor's charges, the
//! service's charges, the outbox events and the settled keys are the same number.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::RwLock;

use crate::card_sim::CardSim;
use crate::helpers::{ACME, Backend, Footprint, Service, TestDatabase, http_client, new_key, visa};

/// How long instances are killed while clients charge.
const CHAOS: Duration = Duration::from_secs(15);
const CLIENTS: usize = 4;

/// A small deterministic generator: the test needs spread, not cryptographic randomness.
struct Dice(u64);

impl Dice {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn settings(card_sim: &CardSim) -> Vec<(&'static str, String)> {
    vec![
        ("PAYMENTS__PROCESSOR__URL", card_sim.url.clone()),
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "1000".into()),
        ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "1100".into()),
        ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "2".into()),
        ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "200".into()),
    ]
}

async fn start(db_url: &str, settings: &[(&'static str, String)]) -> Service {
    let env: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Service::start(db_url, &env).await
}

/// Two instances; a killed one is replaced by a new process on a new port.
type Instances = Arc<RwLock<Vec<Service>>>;

/// Posts `key` until a 201 (first or replay) and returns its charge id; `None` when the
/// deadline passes first. Connection errors, 409 and 503 are retried.
async fn charge_until_settled(
    instances: &Instances,
    key: &str,
    body: &Value,
    dice: &mut Dice,
    deadline: Instant,
) -> Option<String> {
    while Instant::now() < deadline {
        let url = {
            let instances = instances.read().await;
            instances[dice.below(instances.len() as u64) as usize].url("/charges")
        };
        let sent = http_client()
            .post(url)
            .bearer_auth(ACME)
            .header("Idempotency-Key", key)
            .json(body)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            if status == 201 {
                let charge: Value = response.json().await.ok()?;
                return charge["id"].as_str().map(str::to_owned);
            }
            assert!(
                matches!(status, 409 | 503),
                "only 201, 409 or 503 while instances die: got {status}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50 + dice.below(200))).await;
    }
    None
}

async fn kill_nine_soak_every_key_charges_exactly_once(backend: Backend) {
    let card_sim = CardSim::start_with_latency_ms(30).await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let instances: Instances = Arc::new(RwLock::new(vec![
        start(&db.url, &settings).await,
        start(&db.url, &settings).await,
    ]));
    let chaos_ends = Instant::now() + CHAOS;

    let killer = tokio::spawn({
        let (instances, settings, url) = (instances.clone(), settings.clone(), db.url.clone());
        async move {
            let mut dice = Dice::new(0x9e37_79b9_7f4a_7c15);
            let mut kills = 0;
            while Instant::now() < chaos_ends {
                tokio::time::sleep(Duration::from_millis(1_000 + dice.below(2_000))).await;
                let victim = dice.below(2) as usize;
                let replacement = start(&url, &settings).await;
                let mut old = std::mem::replace(&mut instances.write().await[victim], replacement);
                old.kill().await;
                kills += 1;
            }
            kills
        }
    });

    // Each client charges fresh keys while the chaos lasts, each key until it settles; then
    // every key it started is driven to its end with both instances up.
    let clients = (0..CLIENTS).map(|client| {
        let instances = instances.clone();
        tokio::spawn(async move {
            let mut dice = Dice::new(client as u64 + 7);
            let mut answers: HashMap<String, HashSet<String>> = HashMap::new();
            let mut keys = Vec::new();
            while Instant::now() < chaos_ends {
                let key = new_key();
                let body = visa(100 + dice.below(9_000) as i64);
                if let Some(id) =
                    charge_until_settled(&instances, &key, &body, &mut dice, chaos_ends).await
                {
                    answers.entry(key.clone()).or_default().insert(id);
                }
                keys.push((key, body));
            }
            (answers, keys)
        })
    });
    let mut answers: HashMap<String, HashSet<String>> = HashMap::new();
    let mut keys: Vec<(String, Value)> = Vec::new();
    for client in futures::future::join_all(clients).await {
        let (client_answers, client_keys) = client.expect("client task");
        for (key, ids) in client_answers {
            answers.entry(key).or_default().extend(ids);
        }
        keys.extend(client_keys);
    }
    let kills = killer.await.expect("killer task");
    assert!(kills >= 4, "instances were killed {kills} times");

    // With both instances up, every key once more: one still unsettled settles now, and one
    // settled during the chaos must name the same charge again.
    let mut dice = Dice::new(42);
    let settle_by = Instant::now() + Duration::from_secs(30);
    for (key, body) in &keys {
        let id = charge_until_settled(&instances, key, body, &mut dice, settle_by)
            .await
            .unwrap_or_else(|| panic!("key {key} never settled"));
        answers.entry(key.clone()).or_default().insert(id);
    }

    for (key, ids) in &answers {
        assert_eq!(ids.len(), 1, "key {key} answered {ids:?}");
    }
    let keys = answers.len() as i64;
    assert!(keys >= 20, "the soak charged {keys} keys");
    assert_eq!(card_sim.charges_created().await, keys, "processor charges");
    let footprint = Footprint::of(&db.pool).await;
    assert_eq!(
        (
            footprint.charges,
            footprint.ledger_transactions,
            footprint.outbox_events
        ),
        (keys, keys, keys),
        "service charges, ledger transactions and outbox events"
    );
}

on_every_backend!(kill_nine_soak_every_key_charges_exactly_once);
