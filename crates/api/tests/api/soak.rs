//! The kill -9 soak: clients charge fresh keys through two instances, retrying each key until
//! it settles, while instances are SIGKILLed and restarted at random every 1 to 3 seconds; one
//! charge in three is a hold, captured under a key of its own once it is made. At the end
//! every key answered exactly one charge (a capture key, one captured charge), and the
//! processor's charges, authorisations and captures, the service's charges, ledger
//! transactions and outbox events are exactly what the settled keys made.

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

/// Posts `body` to `path` under `key` until the answer is `settled` (first or replay) and
/// returns its body; `None` when the deadline passes first. Connection errors, 409 and 503 are
/// retried.
async fn post_until_settled(
    instances: &Instances,
    (path, key, body): (&str, &str, &Value),
    settled: u16,
    dice: &mut Dice,
    deadline: Instant,
) -> Option<Value> {
    while Instant::now() < deadline {
        let url = {
            let instances = instances.read().await;
            instances[dice.below(instances.len() as u64) as usize].url(path)
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
            if status == settled {
                return response.json().await.ok();
            }
            assert!(
                matches!(status, 409 | 503),
                "only {settled}, 409 or 503 while instances die: got {status}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50 + dice.below(200))).await;
    }
    None
}

/// One client's flow: a charge captured at once, or a hold and its capture under a key of its
/// own.
#[derive(Debug, Clone)]
struct Flow {
    key: String,
    body: Value,
    capture_key: Option<String>,
}

/// What a key answered: the charge's id, with what a capture took.
fn answer_of(charge: &Value) -> String {
    format!("{} {}", charge["id"], charge["amount_captured"])
}

/// Drives `flow` until it settles or the deadline passes, and notes each key's answer.
async fn run_flow(
    instances: &Instances,
    flow: &Flow,
    answers: &mut HashMap<String, HashSet<String>>,
    dice: &mut Dice,
    deadline: Instant,
) -> bool {
    let Some(charge) = post_until_settled(
        instances,
        ("/charges", &flow.key, &flow.body),
        201,
        dice,
        deadline,
    )
    .await
    else {
        return false;
    };
    answers
        .entry(flow.key.clone())
        .or_default()
        .insert(answer_of(&charge));
    let Some(capture_key) = &flow.capture_key else {
        return true;
    };
    let path = format!(
        "/charges/{}/capture",
        charge["id"].as_str().unwrap_or_default()
    );
    let everything = serde_json::json!({});
    let sent = (path.as_str(), capture_key.as_str(), &everything);
    let Some(captured) = post_until_settled(instances, sent, 200, dice, deadline).await else {
        return false;
    };
    assert_eq!(captured["status"], "succeeded", "{captured}");
    answers
        .entry(capture_key.clone())
        .or_default()
        .insert(answer_of(&captured));
    true
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

    // Each client runs fresh flows while the chaos lasts, each until it settles; then every
    // flow it started is driven to its end with both instances up.
    let clients = (0..CLIENTS).map(|client| {
        let instances = instances.clone();
        tokio::spawn(async move {
            let mut dice = Dice::new(client as u64 + 7);
            let mut answers: HashMap<String, HashSet<String>> = HashMap::new();
            let mut flows = Vec::new();
            while Instant::now() < chaos_ends {
                let mut body = visa(100 + dice.below(9_000) as i64);
                let held = dice.below(3) == 0;
                if held {
                    body["capture"] = Value::Bool(false);
                }
                let flow = Flow {
                    key: new_key(),
                    body,
                    capture_key: held.then(new_key),
                };
                run_flow(&instances, &flow, &mut answers, &mut dice, chaos_ends).await;
                flows.push(flow);
            }
            (answers, flows)
        })
    });
    let mut answers: HashMap<String, HashSet<String>> = HashMap::new();
    let mut flows: Vec<Flow> = Vec::new();
    for client in futures::future::join_all(clients).await {
        let (client_answers, client_flows) = client.expect("client task");
        for (key, ids) in client_answers {
            answers.entry(key).or_default().extend(ids);
        }
        flows.extend(client_flows);
    }
    let kills = killer.await.expect("killer task");
    assert!(kills >= 4, "instances were killed {kills} times");

    // With both instances up, every flow once more: one still unsettled settles now, and one
    // settled during the chaos must answer the same again.
    let mut dice = Dice::new(42);
    let settle_by = Instant::now() + Duration::from_secs(30);
    for flow in &flows {
        let settled = run_flow(&instances, flow, &mut answers, &mut dice, settle_by).await;
        assert!(settled, "flow {flow:?} never settled");
    }

    for (key, ids) in &answers {
        assert_eq!(ids.len(), 1, "key {key} answered {ids:?}");
    }
    let charges = flows.len() as i64;
    let holds = flows.iter().filter(|f| f.capture_key.is_some()).count() as i64;
    assert!(charges >= 20, "the soak charged {charges} keys");
    assert!(holds >= 3, "the soak held {holds} of them");
    assert_eq!(answers.len() as i64, charges + holds, "every key answered");
    assert_eq!(
        card_sim.charges_created().await,
        charges,
        "processor charges"
    );
    assert_eq!(
        card_sim.authorizations_created().await,
        holds,
        "processor authorisations"
    );
    assert_eq!(
        card_sim.captures_created().await,
        holds,
        "processor captures"
    );
    let footprint = Footprint::of(&db.pool).await;
    assert_eq!(
        (
            footprint.charges,
            footprint.ledger_transactions,
            footprint.outbox_events
        ),
        (charges, charges, charges + holds),
        "service charges, ledger transactions (a hold posts at its capture) and outbox events \
         (a hold has payment.authorized and payment.completed)"
    );
}

on_every_backend!(kill_nine_soak_every_key_charges_exactly_once);
