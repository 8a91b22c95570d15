//! `charge` through `HttpCardProcessor`: exactly once per key, and every failure mapped to the
//! port's two errors.

use std::time::{Duration, Instant};

use payments_card_sim::HttpCardProcessor;
use payments_domain::{CardProcessor, ProcessorChargeStatus, ProcessorError, ProcessorMismatch};

use crate::helpers::{LATENCY, PATIENT, charge_appears, request, spawn_sim, spawn_slow_sim, usd};

#[tokio::test]
async fn the_same_key_twice_returns_the_same_charge_and_creates_one() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);

    let first = processor
        .charge(request("order-1", "tok_visa"))
        .await
        .expect("first charge");
    let second = processor
        .charge(request("order-1", "tok_visa"))
        .await
        .expect("retried charge");

    assert_eq!(first.id, second.id);
    assert!(first.id.starts_with("sim_"), "id {}", first.id);
    assert_eq!(first.money, usd(1999));
    assert_eq!(first.status, ProcessorChargeStatus::Succeeded);
    assert_eq!(sim.charges_created().await, 1);
}

#[tokio::test]
async fn different_keys_create_different_charges() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);

    let a = processor.charge(request("a", "tok_visa")).await;
    let b = processor.charge(request("b", "tok_mastercard")).await;

    assert_ne!(a.expect("a").id, b.expect("b").id);
    assert_eq!(sim.charges_created().await, 2);
}

#[tokio::test]
async fn a_decline_is_declined_every_time_and_creates_nothing() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);

    for _ in 0..2 {
        let result = processor.charge(request("k", "tok_chargeDeclined")).await;
        assert_eq!(
            result,
            Err(ProcessorError::Declined {
                decline_code: "generic_decline".into(),
                message: "The card was declined.".into(),
            })
        );
    }
    let unknown = processor.charge(request("k2", "tok_stolen")).await;
    assert!(
        matches!(&unknown, Err(ProcessorError::Declined { decline_code, .. }) if decline_code == "invalid_token"),
        "{unknown:?}"
    );
    assert_eq!(sim.charges_created().await, 0);
}

#[tokio::test]
async fn a_processing_error_is_unavailable_and_creates_nothing() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);

    for _ in 0..2 {
        let result = processor.charge(request("k", "tok_processingError")).await;
        assert!(
            matches!(&result, Err(ProcessorError::Unavailable { reason }) if reason.contains("500")),
            "{result:?}"
        );
    }
    assert_eq!(sim.charges_created().await, 0);
}

#[tokio::test]
async fn a_transient_failure_then_a_retry_with_the_same_key_charges_once() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);

    let first = processor
        .charge(request("k", "tok_processingErrorOnce"))
        .await;
    assert!(
        matches!(first, Err(ProcessorError::Unavailable { .. })),
        "{first:?}"
    );
    assert_eq!(sim.charges_created().await, 0);

    let retry = processor
        .charge(request("k", "tok_processingErrorOnce"))
        .await;
    assert!(retry.is_ok(), "{retry:?}");
    assert_eq!(sim.charges_created().await, 1);
}

/// The realistic timeout: the processor is still working when the client gives up. The client
/// must not call that a success or a decline; the charge still comes into existence after its
/// latency, and a retry with the same key must find that charge rather than make a second one.
#[tokio::test]
async fn a_client_that_times_out_still_leaves_a_charge_that_appears_after_the_latency() {
    let sim = spawn_slow_sim().await;
    let impatient = sim.processor(Duration::from_millis(300));
    let began = Instant::now();

    let result = impatient.charge(request("order-9", "tok_visa")).await;
    assert_eq!(
        result,
        Err(ProcessorError::Unavailable {
            reason: "no answer within 300 ms; the outcome is unknown".into()
        })
    );
    // Lookups carry no latency, so even the impatient client can ask what happened: nothing
    // yet, and then the charge.
    assert_eq!(impatient.find_charge("order-9").await, Ok(None));
    let found = charge_appears(&impatient, "order-9").await;
    assert!(began.elapsed() >= LATENCY, "{:?}", began.elapsed());
    assert_eq!(found.money, usd(1999));
    assert_eq!(found.status, ProcessorChargeStatus::Succeeded);
    assert_eq!(sim.charges_created().await, 1);

    let retried = sim
        .processor(PATIENT)
        .charge(request("order-9", "tok_visa"))
        .await;
    assert_eq!(retried, Ok(found));
    assert_eq!(sim.charges_created().await, 1);
}

/// A processor that charges another amount than asked is reported as it is, so the service can
/// refuse to record it.
#[tokio::test]
async fn an_amount_mismatch_is_reported_one_minor_unit_larger() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);

    let charge = processor
        .charge(request("k", "tok_amountMismatch"))
        .await
        .expect("charge");

    assert_eq!(charge.money, usd(2000));
    assert_eq!(charge.status, ProcessorChargeStatus::Succeeded);
    assert_eq!(
        charge.confirms(usd(1999)),
        Err(ProcessorMismatch::Money {
            id: charge.id.clone(),
            reported: usd(2000),
            requested: usd(1999),
        })
    );
    assert_eq!(processor.find_charge("k").await, Ok(Some(charge)));
    assert_eq!(sim.charges_created().await, 1);
}

#[tokio::test]
async fn an_unreachable_processor_is_unavailable() {
    // A port that was free a moment ago and has no listener now.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let processor = HttpCardProcessor::new(&format!("http://{address}"), PATIENT)
        .expect("build HttpCardProcessor");

    let charge = processor.charge(request("k", "tok_visa")).await;
    let find = processor.find_charge("k").await;
    let cancel = processor.cancel("k").await;

    assert!(
        matches!(charge, Err(ProcessorError::Unavailable { .. })),
        "{charge:?}"
    );
    assert!(
        matches!(find, Err(ProcessorError::Unavailable { .. })),
        "{find:?}"
    );
    assert!(
        matches!(cancel, Err(ProcessorError::Unavailable { .. })),
        "{cancel:?}"
    );
}
