//! Reconciliation: `payments-api reconcile --date` matches the day's settlement report of a
//! real card-sim against the books, settles a pending record the report shows was charged,
//! and keeps every difference as an exception, once.

use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::{Days, Utc};
use serde_json::{Value, json};
use tokio::process::Command;

use crate::card_sim::CardSim;
use crate::helpers::{
    ACME, Backend, Footprint, Service, TestApp, TestDatabase, count_rows, new_key, problem,
    spawn_app_with, visa, with_card_sim,
};

/// Runs `payments-api reconcile --date <today> --json` against `db` and `card_sim`; returns
/// its exit status and its JSON.
pub(crate) async fn reconcile(db: &TestDatabase, card_sim: &CardSim) -> (i32, Value) {
    let today = Utc::now().date_naive().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_payments-api"))
        .args(["reconcile", "--date", &today, "--json"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .env("PAYMENTS__PROCESSOR__URL", &card_sim.url)
        .env("PAYMENTS__LOG__FORMAT", "text")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run payments-api reconcile");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let run: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "reconcile printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().expect("an exit status"), run)
}

/// The item of `run` about `processor_id`.
fn item<'a>(run: &'a Value, processor_id: &str) -> &'a Value {
    run["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|item| item["processor_id"] == processor_id)
        .unwrap_or_else(|| panic!("no item for {processor_id} in {run}"))
}

/// The processor's id of the charge a 201 created.
async fn charged(app: &TestApp, amount: i64) -> (String, String) {
    let response = app.post_charge(ACME, &new_key(), &visa(amount)).await;
    assert_eq!(response.status().as_u16(), 201);
    let charge: Value = response.json().await.expect("charge");
    let id = charge["id"].as_str().expect("id").to_owned();
    let processor_id = charge["processor_charge_id"]
        .as_str()
        .expect("processor id");
    (id, processor_id.to_owned())
}

async fn after_fifty_charges_and_ten_refunds_every_item_matches(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let mut charges = Vec::new();
    for i in 0..50 {
        charges.push(charged(&app, 1_000 + i).await.0);
    }
    for charge in &charges[..10] {
        let refund = app
            .post_refund(ACME, charge, &new_key(), &json!({ "amount": 300 }))
            .await;
        assert_eq!(refund.status().as_u16(), 201);
    }

    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(status, 0, "{run}");
    assert_eq!(run["counts"]["matched"], 60, "{run}");
    assert_eq!(run["exceptions"], 0);
    assert_eq!(run["items"], json!([]));

    // Runs are idempotent by day: the same counts, nothing added.
    let (status, again) = reconcile(&app.database, &card_sim).await;
    assert_eq!((status, &again["counts"]), (0, &run["counts"]));
    assert_eq!(count_rows(app.db(), "reconciliation_runs").await, 1);
}

async fn every_difference_is_an_exception_kept_once(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let (_, kept) = charged(&app, 500).await;
    let (_, dropped) = charged(&app, 600).await;
    let (_, altered) = charged(&app, 700).await;
    card_sim.drop_from_report(&dropped).await;
    card_sim.alter_in_report(&altered, 701).await;
    let unsolicited = card_sim.unsolicited_charge("made-elsewhere", 800).await;

    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(status, 3, "exceptions make a non-zero exit: {run}");
    assert_eq!(run["counts"]["matched"], 1, "{run}");
    assert_eq!(run["exceptions"], 3);
    assert!(
        run["items"]
            .as_array()
            .expect("items")
            .iter()
            .all(|i| i["processor_id"] != kept)
    );
    let books_only = item(&run, &dropped);
    assert_eq!(books_only["result"], "books_only");
    assert_eq!(books_only["books"]["amount"], 600);
    assert_eq!(books_only["processor"], Value::Null);
    let mismatch = item(&run, &altered);
    assert_eq!(mismatch["result"], "amount_mismatch");
    assert_eq!(
        (
            &mismatch["processor"]["amount"],
            &mismatch["books"]["amount"]
        ),
        (&json!(701), &json!(700))
    );
    let processor_only = item(&run, &unsolicited);
    assert_eq!(processor_only["result"], "processor_only");
    assert_eq!(
        processor_only["processor"]["processor_key"],
        "made-elsewhere"
    );
    assert_eq!(processor_only["tenant"], "acme");
    assert_eq!(run["exceptions_added"], 3);
    assert_eq!(count_rows(app.db(), "reconciliation_exceptions").await, 3);

    // Never a new charge for what only the processor holds.
    assert_eq!(card_sim.charges_created().await, 4);
    assert_eq!(count_rows(app.db(), "charges").await, 3);

    let (status, again) = reconcile(&app.database, &card_sim).await;
    assert_eq!((status, &again["exceptions"]), (3, &json!(3)));
    assert_eq!(again["exceptions_added"], 0, "a second run adds nothing");
    assert_eq!(count_rows(app.db(), "reconciliation_exceptions").await, 3);
}

/// The processor needs 1.5 s for a charge, the service gives up after 0.3 s, and the completer
/// is kept out of the way: only the run can settle the record.
async fn a_pending_record_whose_charge_is_in_the_report_is_settled_by_the_run(backend: Backend) {
    let card_sim = CardSim::start_with_latency_ms(1_500).await;
    let db = TestDatabase::create(backend).await;
    let settings = [
        ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "300"),
        ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "3600000"),
    ];
    let service = Service::start(&db.url, &settings).await;
    let key = new_key();
    let (status, _) = problem(service.post_charge(&key, &visa(900)).await).await;
    assert_eq!(status, 503);
    let deadline = Instant::now() + Duration::from_secs(30);
    while card_sim.charges_created().await < 1 {
        assert!(
            Instant::now() < deadline,
            "the processor never made the charge"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        Footprint::of(&db.pool).await.charges,
        0,
        "the record is pending"
    );

    let (status, run) = reconcile(&db, &card_sim).await;
    assert_eq!(status, 0, "a settled record is not an exception: {run}");
    assert_eq!(run["counts"]["settled"], 1, "{run}");
    assert_eq!(run["exceptions"], 0);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
    assert_eq!(card_sim.charges_created().await, 1);

    // The client's retry replays the charge the run recorded.
    let replay = service.post_charge(&key, &visa(900)).await;
    assert_eq!(replay.status().as_u16(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
}

/// `workers.reconcile_at` runs the previous day's reconciliation every day.
async fn the_daily_worker_reconciles_the_previous_day(backend: Backend) {
    let card_sim = CardSim::start().await;
    let at = (Utc::now() + chrono::Duration::seconds(2))
        .format("%H:%M:%S")
        .to_string();
    let app = spawn_app_with(
        backend,
        &[
            ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
            ("PAYMENTS__WORKERS__RECONCILE_AT", at.as_str()),
        ],
    )
    .await;
    let yesterday = Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(1))
        .expect("a day")
        .to_string();
    let sql = format!(
        "SELECT count(*) FROM reconciliation_runs WHERE {} = '{yesterday}'",
        app.database.date_text("report_date")
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs: i64 = sqlx::query_scalar(&sql)
            .fetch_one(app.db())
            .await
            .expect(&sql);
        if runs == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never reconciled {yesterday}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

on_every_backend!(
    after_fifty_charges_and_ten_refunds_every_item_matches,
    every_difference_is_an_exception_kept_once,
    a_pending_record_whose_charge_is_in_the_report_is_settled_by_the_run,
    the_daily_worker_reconciles_the_previous_day,
);
