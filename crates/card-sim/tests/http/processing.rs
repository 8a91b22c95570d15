//! A slow processor, over raw HTTP: a charge, a refund or a payout comes into existence only
//! once its latency has passed; until then its key is processing, and nothing about it is definitive.

use std::time::Instant;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    CHARGES, Kind, LATENCY, PAYOUTS, REACH, REFUNDS, TestSim, charge_body, payout_body,
    refund_body, spawn_slow_sim, usd,
};

#[tokio::test]
async fn a_refund_does_not_exist_until_its_latency_has_passed() {
    let sim = spawn_slow_sim().await;
    let (_, charge) = sim.charged(usd(1999)).await;
    let body = refund_body(&charge.id, 500);

    let refund = exists_only_after_its_latency(&sim, REFUNDS, &body).await;
    assert_eq!(refund["object"], "refund");
    assert_eq!(refund["charge"], charge.id.as_str());
    assert_eq!(refund["amount"], 500);
    assert_eq!(refund["currency"], "USD");
}

#[tokio::test]
async fn a_payout_does_not_exist_until_its_latency_has_passed() {
    let sim = spawn_slow_sim().await;
    let payout =
        exists_only_after_its_latency(&sim, PAYOUTS, &payout_body("ba_checking", 700)).await;
    assert_eq!(payout["object"], "payout");
    assert_eq!(payout["destination"], "ba_checking");
    assert_eq!(payout["amount"], 700);
    assert_eq!(payout["currency"], "USD");
}

#[tokio::test]
async fn a_charge_does_not_exist_until_its_latency_has_passed() {
    let sim = spawn_slow_sim().await;
    exists_only_after_its_latency(&sim, CHARGES, &charge_body("tok_visa")).await;
}

/// The first call under a key processes for the simulator's latency. Meanwhile a lookup finds
/// nothing, a cancel and a second call under the key answer 409 `processing`, and nothing is
/// counted; then the call answers 200 `succeeded`, and a lookup and a repeat answer the same.
/// Returns that body.
async fn exists_only_after_its_latency(sim: &TestSim, kind: Kind, body: &Value) -> Value {
    let began = Instant::now();
    let probes = async {
        tokio::time::sleep(REACH).await;
        let lookup = sim.find(kind, "k").await;
        let cancel = sim.cancel(kind, Some("k")).await;
        let second = sim.create(kind, Some("k"), body).await;
        let created = sim.created(kind).await;
        (lookup, cancel, second, created, began.elapsed())
    };
    // `join!` polls the first call first, so it is the call that registers the key.
    let ((status, first), (lookup, cancel, second, created, probed_after)) =
        tokio::join!(sim.create(kind, Some("k"), body), probes);

    assert!(probed_after < LATENCY, "probes took {probed_after:?}");
    assert_eq!(lookup.0, StatusCode::NOT_FOUND, "{}", lookup.1);
    for (status, body) in [&cancel, &second] {
        assert_eq!(*status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["type"], "api_error", "{body}");
        assert_eq!(body["error"]["code"], "processing", "{body}");
    }
    assert_eq!(created, 0);

    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(began.elapsed() >= LATENCY, "{:?}", began.elapsed());
    assert_eq!(first["status"], "succeeded");
    assert_eq!(sim.find(kind, "k").await, (StatusCode::OK, first.clone()));
    assert_eq!(
        sim.create(kind, Some("k"), body).await,
        (StatusCode::OK, first.clone())
    );
    assert_eq!(sim.created(kind).await, 1);
    first
}
