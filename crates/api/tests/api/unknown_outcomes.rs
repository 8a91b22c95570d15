//! Unknown outcomes: a processor that is slow, answers after the service's timeout, or reports
//! a charge that is not the one asked for. "I could not reach the processor" is never read as
//! "there is no charge": every charge the processor made ends in the ledger exactly once, and
//! a mismatched one never does.

use std::time::Duration;

use serde_json::json;

use crate::card_sim::CardSim;
use crate::helpers::{
    Backend, Footprint, Service, TestDatabase, metrics_text, new_key, problem, record_state, visa,
};

/// The processor needs 2.5 s for a charge; the service gives up after 0.5 s and lets the
/// completer settle a released record 1 s after its lock ended, while the processor is still
/// working on it (so the completer's first answer is "still processing").
const PROCESSOR_LATENCY_MS: u64 = 2_500;

fn slow_processor_settings(card_sim: &CardSim) -> Vec<(&'static str, &str)> {
    vec![
        ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "500"),
        ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "1000"),
        ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "200"),
    ]
}

/// Waits (bounded) until the service's tables hold `expected`.
async fn wait_for_footprint(db: &TestDatabase, expected: Footprint) {
    for _ in 0..150 {
        if Footprint::of(&db.pool).await == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(Footprint::of(&db.pool).await, expected, "never settled");
}

async fn a_charge_the_processor_finishes_after_the_timeout_is_recorded_without_the_client(
    backend: Backend,
) {
    let card_sim = CardSim::start_with_latency_ms(PROCESSOR_LATENCY_MS).await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &slow_processor_settings(&card_sim)).await;
    let key = new_key();

    let (status, body) = problem(service.post_charge(&key, &visa(900)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("processor_unavailable"))
    );
    // The client never retries. The charge comes into existence at the processor after 2.5 s,
    // and the completer must record it then, not fail the record while it is processing.
    wait_for_footprint(&db, Footprint::charged(1)).await;
    assert_eq!(card_sim.charges_created().await, 1);
    let state = record_state(&db, &key).await;
    assert_eq!(state, "completed");

    // A retry long after replays that charge.
    let replay = service.post_charge(&key, &visa(900)).await;
    assert_eq!(replay.status().as_u16(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

async fn a_client_retrying_while_the_processor_is_still_processing_is_charged_once(
    backend: Backend,
) {
    let card_sim = CardSim::start_with_latency_ms(PROCESSOR_LATENCY_MS).await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &slow_processor_settings(&card_sim)).await;
    let key = new_key();

    let mut answers = Vec::new();
    let mut created = None;
    for _ in 0..60 {
        let response = service.post_charge(&key, &visa(1_250)).await;
        let status = response.status().as_u16();
        answers.push(status);
        if status == 201 {
            created = Some(response.bytes().await.expect("body"));
            break;
        }
        assert!(
            status == 503 || status == 409,
            "while processing: 503 or 409, got {status}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let created = created.expect("a retry eventually got the charge");
    assert!(
        answers.iter().filter(|s| **s == 503).count() >= 2,
        "retries came while the processor was processing: {answers:?}"
    );
    wait_for_footprint(&db, Footprint::charged(1)).await;
    assert_eq!(card_sim.charges_created().await, 1);
    let replay = service.post_charge(&key, &visa(1_250)).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body"), created);
}

/// A processor that reports a charge for another amount (a bug, or a key mix-up on its side)
/// never gets it into the ledger: the record stays pending and the mismatch is counted.
async fn a_processor_charge_for_another_amount_is_never_recorded(backend: Backend) {
    let card_sim = CardSim::start_with_latency_ms(1_000).await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(
        &db.url,
        &[
            ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
            ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "300"),
            ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "400"),
            ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "100"),
        ],
    )
    .await;
    let key = new_key();
    let body = json!({ "amount": 500, "currency": "usd", "source": "tok_amountMismatch" });
    let response = service.post_charge(&key, &body).await;
    assert_eq!(response.status().as_u16(), 503, "the call timed out");

    // The completer's lookup finds the processor's charge, for 501: it must not post it.
    let mut mismatches = 0.0;
    for _ in 0..100 {
        mismatches = metric(&service, "processor_mismatch_total").await;
        if mismatches >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(mismatches >= 1.0, "processor_mismatch_total moved");
    assert_eq!(card_sim.charges_created().await, 1);
    let footprint = Footprint::of(&db.pool).await;
    assert_eq!(
        (
            footprint.charges,
            footprint.ledger_transactions,
            footprint.outbox_events
        ),
        (0, 0, 0)
    );
    let state = record_state(&db, &key).await;
    assert_eq!(state, "pending", "never failed, never completed");
}

/// The value of an unlabelled metric in the service's `/metrics`, 0 when absent.
async fn metric(service: &Service, name: &str) -> f64 {
    let text = metrics_text(&service.metrics_url).await;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

on_every_backend!(
    a_charge_the_processor_finishes_after_the_timeout_is_recorded_without_the_client,
    a_client_retrying_while_the_processor_is_still_processing_is_charged_once,
    a_processor_charge_for_another_amount_is_never_recorded,
);
