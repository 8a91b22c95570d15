//! One instance frozen with a transaction open (a paused VM, a live migration, `docker pause`,
//! or a network cut between it and the database, which the database cannot tell apart) never
//! stalls the fleet: the other instance's claims of every tenant go on, a retry of a key the
//! frozen instance holds is told it is in flight, and the database ends the frozen
//! transaction on its own, within `database.idle_in_transaction_timeout_ms`. Once the instance
//! thaws, every key ends with exactly one charge.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::Client;
use serde_json::Value;
use sqlx::{Connection, PgConnection};

use crate::card_sim::CardSim;
use crate::helpers::{
    ACME, Backend, Footprint, GLOBEX, Service, TestDatabase, assert_ledger_balances_in,
    http_client, new_key, visa,
};

/// How long the database lets a session sit inside a transaction without a statement, here.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(3);

/// The settings of both instances: a statement timeout short enough that, on a build whose
/// finishes wait for a held row for as long as any statement does, the finishes queued behind
/// one waiting finish are written as a batch while the row is still held.
/// A lock of 8 s outlasts the freeze, so the frozen instance's keys are in flight throughout
/// it, and ends soon after: an attempt the frozen instance gives up when it thaws (every timer
/// it had runs out at once) leaves its record locked until then.
const SETTINGS: [(&str, &str); 5] = [
    ("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "2000"),
    ("PAYMENTS__DATABASE__IDLE_IN_TRANSACTION_TIMEOUT_MS", "3000"),
    ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "8"),
    ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "3000"),
    ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "4000"),
];

async fn send_charge(client: &Client, service: &Service, api_key: &str, key: &str) -> (u16, Value) {
    let response = client
        .post(service.url("/charges"))
        .bearer_auth(api_key)
        .header("Idempotency-Key", key)
        .json(&visa(100))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /charges under {key}: {e}"));
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// A connection of the test's own holding every part of acme's USD balances, inserted or
/// locked, in a transaction it leaves open: every finish of an acme charge waits on it.
async fn hold_acme_balances(url: &str) -> (PgConnection, i32) {
    let mut holder = PgConnection::connect(url)
        .await
        .expect("connect the holder");
    let statements = [
        "BEGIN",
        "INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)
         SELECT 'acme', account, 'USD', part, 0
         FROM (SELECT DISTINCT account FROM ledger_entries WHERE tenant_id = 'acme') accounts,
              generate_series(0, 63) AS part
         ON CONFLICT (tenant_id, account, currency, part)
         DO UPDATE SET amount = ledger_balances.amount",
    ];
    for statement in statements {
        sqlx::query(statement)
            .execute(&mut holder)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .expect("the holder's pid");
    (holder, pid)
}

/// How many sessions wait for a row the session `holder` holds.
async fn waiting_on(watcher: &mut PgConnection, holder: i32) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))",
    )
    .bind(holder)
    .fetch_one(watcher)
    .await
    .expect("pg_stat_activity")
}

/// The sessions that have sat inside a transaction, without a statement, for over `for_ms`.
async fn idle_in_transaction(watcher: &mut PgConnection, for_ms: i64) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND state LIKE 'idle in transaction%'
           AND state_change < now() - make_interval(secs => $1 / 1000.0)",
    )
    .bind(for_ms as f64)
    .fetch_all(watcher)
    .await
    .expect("pg_stat_activity")
}

/// The keys of `keys` whose records exist, and are not completed: the keys a frozen instance
/// holds.
async fn pending_of(watcher: &mut PgConnection, keys: &[String]) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT idempotency_key FROM idempotency_records
         WHERE tenant_id = 'acme' AND state = 'pending' AND idempotency_key = ANY($1)
         ORDER BY idempotency_key",
    )
    .bind(keys)
    .fetch_all(watcher)
    .await
    .expect("pending records")
}

/// Sends `key` to `service` as `api_key` until it is answered 201 (bounded), honouring
/// `Retry-After`.
async fn until_charged(client: &Client, service: &Service, api_key: &str, key: &str) {
    let mut answers = Vec::new();
    for _ in 0..40 {
        let (status, body) = send_charge(client, service, api_key, key).await;
        if status == 201 {
            return;
        }
        answers.push(format!("{status} {}", body["code"]));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{key} was never charged: {answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_mid_transaction_stalls_no_other_tenant_and_its_keys_charge_once() {
    let db = TestDatabase::create(Backend::Postgres).await;
    let card_sim = CardSim::start().await;
    let mut env = SETTINGS.to_vec();
    env.push(("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()));
    let frozen = Service::start(&db.url, &env).await;
    let other = Service::start(&db.url, &env).await;
    let client = http_client();
    // A first charge of each tenant, so that their ledger accounts exist.
    for api_key in [ACME, GLOBEX] {
        until_charged(&client, &other, api_key, &new_key()).await;
    }
    let mut charged = 2;

    // Acme's balances are held, and acme's charges stream into the instance to be frozen:
    // their finishes wait there, one after the other, alone or in batches.
    let (mut holder, holder_pid) = hold_acme_balances(&db.url).await;
    let held_since = Instant::now();
    let answered: Arc<Mutex<BTreeMap<String, u16>>> = Arc::default();
    let mut sent = Vec::new();
    let mut in_flight = Vec::new();
    let mut watcher = PgConnection::connect(&db.url).await.expect("connect");
    loop {
        let key = new_key();
        sent.push(key.clone());
        let (client, url, answered) = (
            client.clone(),
            frozen.url("/charges"),
            Arc::clone(&answered),
        );
        in_flight.push(tokio::spawn(async move {
            let response = client
                .post(url)
                .bearer_auth(ACME)
                .header("Idempotency-Key", &key)
                .json(&visa(100))
                .send()
                .await;
            if let Ok(response) = response {
                answered
                    .lock()
                    .expect("answers")
                    .insert(key, response.status().as_u16());
            }
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Past the statement timeout, with a finish waiting on the held rows: freeze.
        if held_since.elapsed() > Duration::from_millis(2_500)
            && waiting_on(&mut watcher, holder_pid).await > 0
        {
            break;
        }
        assert!(
            held_since.elapsed() < Duration::from_secs(20),
            "no finish ever waited on the held balances"
        );
    }
    frozen.freeze();
    let frozen_at = Instant::now();
    // The holder lets go: the waiting statement goes on, and its transaction, whose instance
    // is frozen, sits open.
    sqlx::query("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("let the balances go");
    let unanswered: Vec<String> = {
        let answered = answered.lock().expect("answers");
        sent.iter()
            .filter(|key| !answered.contains_key(*key))
            .cloned()
            .collect()
    };
    let frozen_keys = pending_of(&mut watcher, &unanswered).await;
    assert!(!frozen_keys.is_empty(), "the frozen instance holds no key");
    let mut frozen_sessions = Vec::new();
    for _ in 0..100 {
        frozen_sessions = idle_in_transaction(&mut watcher, 200).await;
        if !frozen_sessions.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !frozen_sessions.is_empty(),
        "the frozen instance has no transaction open"
    );

    // Meanwhile on the other instance: another tenant's new charges, and retries of the
    // frozen instance's keys, all at once.
    let globex_keys: Vec<String> = (0..16).map(|_| new_key()).collect();
    let globex = join_all(globex_keys.iter().map(|key| {
        let (client, other) = (&client, &other);
        async move {
            let started = Instant::now();
            let (status, body) = send_charge(client, other, GLOBEX, key).await;
            (status, body["code"].clone(), started.elapsed())
        }
    }));
    let retries = join_all(frozen_keys.iter().map(|key| async {
        let (status, body) = send_charge(&client, &other, ACME, key).await;
        (key.clone(), status, body["code"].clone())
    }));
    let (globex, retries) = tokio::join!(globex, retries);
    for (status, code, took) in &globex {
        assert_eq!(
            (*status, code),
            (201, &Value::Null),
            "another tenant's new charge while an instance is frozen mid-transaction"
        );
        assert!(
            *took < Duration::from_secs(2),
            "another tenant's new charge took {took:?}"
        );
    }
    charged += globex.len();
    for (key, status, code) in &retries {
        assert!(
            [201, 409].contains(status),
            "a retry of the frozen instance's key {key}: {status} {code}"
        );
    }

    // The database ends the frozen instance's transactions on its own, while it stays frozen.
    let bound = IDLE_IN_TRANSACTION + Duration::from_secs(2);
    loop {
        let open = idle_in_transaction(&mut watcher, 0).await;
        if frozen_sessions.iter().all(|pid| !open.contains(pid)) {
            break;
        }
        assert!(
            frozen_at.elapsed() < bound,
            "the frozen instance's transactions {frozen_sessions:?} are still open after {:?}",
            frozen_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Thawed, every key sent ends with exactly one charge.
    frozen.thaw();
    for request in in_flight {
        request.await.expect("a request to the frozen instance");
    }
    for key in &sent {
        until_charged(&client, &other, ACME, key).await;
    }
    charged += sent.len();
    let charged = i64::try_from(charged).expect("a count");
    assert_eq!(
        card_sim.charges_created().await,
        charged,
        "one charge at the processor per key"
    );
    assert_eq!(
        Footprint::of(&db.pool).await,
        Footprint::charged(charged),
        "one charge, one ledger transaction and one event per key"
    );
    assert_ledger_balances_in(&db.pool).await;
}
