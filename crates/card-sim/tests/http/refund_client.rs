//! The refund methods of `HttpCardProcessor` against a slow processor: each answer mapped to
//! the port, and a refund whose client gave up still found under its key.

use std::time::{Duration, Instant};

use payments_domain::{CancelOutcome, CardProcessor, ProcessorError};

use crate::helpers::{
    LATENCY, REACH, REFUNDS, refund_appears, refund_request, spawn_slow_sim, usd,
};

#[tokio::test]
async fn http_card_processor_refund_find_refund_and_cancel_refund_round_trip() {
    let sim = spawn_slow_sim().await;
    let (processor, charge) = sim.charged(usd(1999)).await;
    let refund = processor
        .refund(refund_request("paid", &charge.id, usd(500)))
        .await
        .expect("refund");

    let in_flight = {
        let processor = processor.clone();
        let request = refund_request("slow", &charge.id, usd(500));
        tokio::spawn(async move { processor.refund(request).await })
    };
    tokio::time::sleep(REACH).await;
    let processing = processor.cancel_refund("slow").await;
    let repeated = processor
        .refund(refund_request("slow", &charge.id, usd(500)))
        .await;

    assert_eq!(processing, Ok(CancelOutcome::StillProcessing));
    assert_eq!(
        repeated,
        Err(ProcessorError::Unavailable {
            reason: "processor answered 409 processing".into()
        })
    );
    assert_eq!(
        processor.find_refund("paid").await,
        Ok(Some(refund.clone()))
    );
    assert_eq!(processor.find_refund("unknown").await, Ok(None));
    assert_eq!(
        processor.cancel_refund("paid").await,
        Ok(CancelOutcome::Exists(refund))
    );
    let slow = in_flight
        .await
        .expect("join")
        .expect("the in-flight refund");
    assert_eq!(slow.money, usd(500));
    assert_eq!(processor.find_refund("slow").await, Ok(Some(slow)));
    assert_eq!(
        processor.cancel_refund("never").await,
        Ok(CancelOutcome::Canceled)
    );
    let never = processor
        .refund(refund_request("never", &charge.id, usd(500)))
        .await;
    assert_eq!(
        never,
        Err(ProcessorError::Unavailable {
            reason: "processor answered 409 idempotency_key_canceled".into()
        })
    );
    assert_eq!(sim.created(REFUNDS).await, 2);
}

/// The client gives up while the refund processes: not a success, not a decline. The refund
/// still comes into existence, and a retry under the same key returns it instead of refunding
/// again.
#[tokio::test]
async fn a_client_that_times_out_still_leaves_a_refund_that_appears_after_the_latency() {
    let sim = spawn_slow_sim().await;
    let (patient, charge) = sim.charged(usd(1999)).await;
    let impatient = sim.processor(Duration::from_millis(300));
    let request = refund_request("r", &charge.id, usd(500));
    let began = Instant::now();

    let result = impatient.refund(request.clone()).await;
    let found_at_once = impatient.find_refund("r").await;
    assert_eq!(
        result,
        Err(ProcessorError::Unavailable {
            reason: "no answer within 300 ms; the outcome is unknown".into()
        })
    );
    assert_eq!(found_at_once, Ok(None));
    let found = refund_appears(&impatient, "r").await;
    assert!(began.elapsed() >= LATENCY, "{:?}", began.elapsed());
    assert_eq!(found.money, usd(500));
    assert_eq!(found.processor_charge_id, charge.id);
    assert_eq!(sim.created(REFUNDS).await, 1);

    assert_eq!(patient.refund(request).await, Ok(found));
    assert_eq!(sim.created(REFUNDS).await, 1);
}
