//! `POST /v1/charges/cancel`, `POST /v1/refunds/cancel`, `POST /v1/captures/cancel`,
//! `POST /v1/voids/cancel`, `POST /v1/payouts/cancel` and `HttpCardProcessor::cancel`: the one
//! answer that says a key has nothing under it and never will.

use axum::http::StatusCode;
use payments_card_sim::HttpCardProcessor;
use payments_domain::{CancelOutcome, CardProcessor, ProcessorChargeStatus, ProcessorError};
use serde_json::{Value, json};

use crate::helpers::{
    CAPTURES, CHARGES, Kind, PATIENT, PAYOUTS, REACH, REFUNDS, TestSim, VOIDS, capture_body,
    charge_body, payout_body, refund_body, request, spawn_fake_processor, spawn_sim,
    spawn_slow_sim, usd, void_body,
};

#[tokio::test]
async fn cancel_of_an_unknown_key_tombstones_it_and_a_later_charge_is_refused() {
    let sim = spawn_sim().await;
    cancel_of_an_unused_key_tombstones_it(&sim, CHARGES, &charge_body("tok_visa")).await;
}

#[tokio::test]
async fn cancel_of_a_charged_key_returns_the_charge_and_keeps_it() {
    let sim = spawn_sim().await;
    cancel_of_a_used_key_returns_what_was_made(&sim, CHARGES, &charge_body("tok_visa")).await;
}

#[tokio::test]
async fn cancel_of_an_unused_refund_key_tombstones_it_and_a_later_refund_is_refused() {
    let sim = spawn_sim().await;
    let (_, charge) = sim.charged(usd(1999)).await;
    cancel_of_an_unused_key_tombstones_it(&sim, REFUNDS, &refund_body(&charge.id, 500)).await;
}

#[tokio::test]
async fn cancel_of_a_refunded_key_returns_the_refund_and_keeps_it() {
    let sim = spawn_sim().await;
    let (_, charge) = sim.charged(usd(1999)).await;
    let refund = refund_body(&charge.id, 500);
    cancel_of_a_used_key_returns_what_was_made(&sim, REFUNDS, &refund).await;
}

#[tokio::test]
async fn cancel_of_an_unused_payout_key_tombstones_it_and_a_later_payout_is_refused() {
    let sim = spawn_sim().await;
    cancel_of_an_unused_key_tombstones_it(&sim, PAYOUTS, &payout_body("ba_checking", 500)).await;
}

#[tokio::test]
async fn cancel_of_a_paid_key_returns_the_payout_and_keeps_it() {
    let sim = spawn_sim().await;
    let payout = payout_body("ba_checking", 500);
    cancel_of_a_used_key_returns_what_was_made(&sim, PAYOUTS, &payout).await;
}

#[tokio::test]
async fn cancel_of_an_unused_capture_or_void_key_tombstones_it_and_a_later_one_is_refused() {
    let sim = spawn_sim().await;
    let (_, authorization) = sim.authorized(usd(1999)).await;
    let capture = capture_body(&authorization.id, 500);
    cancel_of_an_unused_key_tombstones_it(&sim, CAPTURES, &capture).await;
    cancel_of_an_unused_key_tombstones_it(&sim, VOIDS, &void_body(&authorization.id)).await;
}

#[tokio::test]
async fn cancel_of_a_captured_key_returns_the_capture_and_keeps_it() {
    let sim = spawn_sim().await;
    let (_, authorization) = sim.authorized(usd(1999)).await;
    let capture = capture_body(&authorization.id, 500);
    cancel_of_a_used_key_returns_what_was_made(&sim, CAPTURES, &capture).await;
}

#[tokio::test]
async fn cancel_of_a_voided_key_returns_the_void_and_keeps_it() {
    let sim = spawn_sim().await;
    let (_, authorization) = sim.authorized(usd(1999)).await;
    let void = void_body(&authorization.id);
    cancel_of_a_used_key_returns_what_was_made(&sim, VOIDS, &void).await;
}

/// A cancel under a key never used tombstones it: a later call under it with `body` is
/// refused with 409 `idempotency_key_canceled` and makes nothing, and the tombstone stays.
async fn cancel_of_an_unused_key_tombstones_it(sim: &TestSim, kind: Kind, body: &Value) {
    let canceled = sim.cancel(kind, Some("k")).await;
    let (status, refused) = sim.create(kind, Some("k"), body).await;

    assert_eq!(canceled, (StatusCode::OK, json!({"status": "canceled"})));
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["type"], "invalid_request_error");
    assert_eq!(refused["error"]["code"], "idempotency_key_canceled");
    assert_eq!(sim.find(kind, "k").await.0, StatusCode::NOT_FOUND);
    // Canceling again answers the same; the tombstone stays.
    assert_eq!(sim.cancel(kind, Some("k")).await, canceled);
    assert_eq!(sim.created(kind).await, 0);
}

/// A cancel under a key that made something answers with it, and leaves it as it is.
async fn cancel_of_a_used_key_returns_what_was_made(sim: &TestSim, kind: Kind, body: &Value) {
    let (status, made) = sim.create(kind, Some("k"), body).await;
    assert_eq!(status, StatusCode::OK, "{made}");

    assert_eq!(
        sim.cancel(kind, Some("k")).await,
        (StatusCode::OK, made.clone())
    );
    assert_eq!(
        sim.create(kind, Some("k"), body).await,
        (StatusCode::OK, made)
    );
    assert_eq!(sim.created(kind).await, 1);
}

#[tokio::test]
async fn cancel_without_an_idempotency_key_is_a_json_400_and_tombstones_nothing() {
    let sim = spawn_sim().await;
    let (status, body) = sim.post_cancel(None).await;

    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"].get("code"), None, "{body}");
}

#[tokio::test]
async fn http_card_processor_cancel_maps_each_answer() {
    let sim = spawn_slow_sim().await;
    let processor = sim.processor(PATIENT);
    let charge = processor
        .charge(request("paid", "tok_visa"))
        .await
        .expect("charge");

    let in_flight = {
        let processor = processor.clone();
        tokio::spawn(async move { processor.charge(request("slow", "tok_visa")).await })
    };
    tokio::time::sleep(REACH).await;
    let processing = processor.cancel("slow").await;
    let repeated = processor.charge(request("slow", "tok_visa")).await;

    assert_eq!(
        processor.cancel("paid").await,
        Ok(CancelOutcome::Exists(charge))
    );
    assert_eq!(processing, Ok(CancelOutcome::StillProcessing));
    assert_eq!(
        repeated,
        Err(ProcessorError::Unavailable {
            reason: "processor answered 409 processing".into()
        })
    );
    assert_eq!(processor.cancel("never").await, Ok(CancelOutcome::Canceled));
    assert_eq!(
        processor.charge(request("never", "tok_visa")).await,
        Err(ProcessorError::Unavailable {
            reason: "processor answered 409 idempotency_key_canceled".into()
        })
    );
    let slow = in_flight
        .await
        .expect("join")
        .expect("the in-flight charge");
    assert_eq!(slow.money, usd(1999));
    assert_eq!(sim.charges_created().await, 2);
}

/// Answers `card-sim` never gives, from a processor that misbehaves: none is mistaken for a
/// cancel, and a charge is taken with the status it reports.
#[tokio::test]
async fn http_card_processor_cancel_maps_any_other_answer_to_unavailable() {
    let pending = r#"{"id": "ch_1", "amount": 1999, "currency": "USD", "status": "pending"}"#;
    let base = spawn_fake_processor(StatusCode::OK, pending).await;
    let reported = HttpCardProcessor::new(&base, PATIENT)
        .expect("client")
        .cancel("k")
        .await;
    let Ok(CancelOutcome::Exists(charge)) = reported else {
        panic!("{reported:?}");
    };
    assert_eq!(charge.status, ProcessorChargeStatus::Pending);
    assert_eq!(charge.money, usd(1999));

    let unavailable = [
        (StatusCode::OK, r#"{"status": "refunded"}"#),
        (
            StatusCode::OK,
            r#"{"id": "ch_1", "amount": 1999, "currency": "USD", "status": "reversed"}"#,
        ),
        (
            StatusCode::CONFLICT,
            r#"{"error": {"type": "invalid_request_error", "code": "idempotency_key_canceled", "message": "x"}}"#,
        ),
        (StatusCode::CONFLICT, "not json"),
        (StatusCode::NOT_FOUND, "{}"),
        (StatusCode::INTERNAL_SERVER_ERROR, "{}"),
    ];
    for (status, body) in unavailable {
        let base = spawn_fake_processor(status, body).await;
        let answer = HttpCardProcessor::new(&base, PATIENT)
            .expect("client")
            .cancel("k")
            .await;
        assert!(
            matches!(answer, Err(ProcessorError::Unavailable { .. })),
            "{status} {body} -> {answer:?}"
        );
    }
}
