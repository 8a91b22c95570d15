//! The key window: a key is remembered, with what was made under it, until the window has
//! passed since it last settled (or was canceled), then forgotten, so that memory holds only
//! the traffic within the window.

use payments_domain::{
    Destination, ProcessorCaptureRequest, ProcessorPayoutRequest, ProcessorRefundRequest,
    ProcessorVoidRequest, SettlementReport, decline,
};

use super::*;

const WINDOW: TimeDelta = TimeDelta::days(1);
const SECOND: TimeDelta = TimeDelta::seconds(1);

fn refund_of(key: &str, charge_id: &str) -> ProcessorRefundRequest {
    ProcessorRefundRequest {
        idempotency_key: key.into(),
        processor_charge_id: charge_id.into(),
        money: usd(10),
        metadata: metadata(&format!("re_{key}")),
    }
}

fn payout(key: &str) -> ProcessorPayoutRequest {
    ProcessorPayoutRequest {
        idempotency_key: key.into(),
        money: usd(10),
        destination: Destination::new("ba_checking").unwrap_or_else(|e| panic!("{e}")),
        metadata: metadata(&format!("po_{key}")),
    }
}

/// How many keys each book remembers and how many expiries it queues (`(keys, queued)`),
/// how many charges can be refunded and how many authorisations captured or voided.
#[derive(Debug, Default, PartialEq, Eq)]
struct Remembered {
    charges: (usize, usize),
    refunds: (usize, usize),
    captures: (usize, usize),
    voids: (usize, usize),
    payouts: (usize, usize),
    refundable: usize,
    capturable: usize,
}

fn remembered(sim: &InMemoryCardProcessor) -> Remembered {
    let state = lock(&sim.state);
    Remembered {
        charges: (state.charges.len(), state.charges.queued()),
        refunds: (state.refunds.len(), state.refunds.queued()),
        captures: (state.captures.len(), state.captures.queued()),
        voids: (state.voids.len(), state.voids.queued()),
        payouts: (state.payouts.len(), state.payouts.queued()),
        refundable: state.refundable.len(),
        capturable: state.capturable.len(),
    }
}

fn capture_of(key: &str, charge_id: &str) -> ProcessorCaptureRequest {
    ProcessorCaptureRequest {
        idempotency_key: key.into(),
        processor_charge_id: charge_id.into(),
        money: usd(100),
        metadata: metadata(&format!("cap_{key}")),
    }
}

fn void_of(key: &str, charge_id: &str) -> ProcessorVoidRequest {
    ProcessorVoidRequest {
        idempotency_key: key.into(),
        processor_charge_id: charge_id.into(),
        metadata: metadata(&format!("void_{key}")),
    }
}

#[tokio::test]
async fn a_key_is_kept_within_the_window_and_forgotten_after_it() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = clock.simulator(WINDOW);
    let charge = sim
        .charge(request("k", "tok_visa"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let made_on = clock.now().date_naive();

    clock.advance(WINDOW - SECOND);
    assert_eq!(sim.find_charge("k").await, Ok(Some(charge.clone())));
    assert_eq!(
        sim.charge(request("k", "tok_visa")).await,
        Ok(charge.clone())
    );
    assert_eq!(sim.settlement_report(made_on).await.map(|l| l.len()), Ok(1));

    clock.advance(SECOND * 2);
    assert_eq!(sim.find_charge("k").await, Ok(None));
    assert_eq!(sim.settlement_report(made_on).await, Ok(vec![]));
    // Its refundable entry went with it.
    let refund = sim.refund(refund_of("r", &charge.id)).await;
    assert!(
        matches!(&refund, Err(ProcessorError::Declined { decline_code, .. }) if decline_code == "no_such_charge"),
        "{refund:?}"
    );
    // The key is new again: a call under it charges anew, as at a processor past its window.
    let again = sim.charge(request("k", "tok_visa")).await;
    assert!(
        again.as_ref().is_ok_and(|again| again.id != charge.id),
        "{again:?}"
    );
    assert_eq!(sim.charges_created(), 2);
}

#[tokio::test]
async fn a_key_settled_again_after_a_transient_failure_lives_by_its_latest_settle() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = clock.simulator(WINDOW);
    let failed = sim.charge(request("k", "tok_processingErrorOnce")).await;
    assert!(is_unavailable(&failed), "{failed:?}");

    clock.advance(WINDOW / 2);
    let charge = sim.charge(request("k", "tok_processingErrorOnce")).await;
    assert!(charge.is_ok(), "{charge:?}");

    // The window of the failure has passed, not that of the charge: its stale expiry must
    // not take the charge with it.
    clock.advance(WINDOW / 2 + SECOND);
    assert_eq!(sim.find_charge("k").await, Ok(charge.clone().ok()));

    clock.advance(WINDOW / 2);
    assert_eq!(sim.find_charge("k").await, Ok(None));
}

#[tokio::test]
async fn a_tombstone_is_forgotten_after_the_window() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = clock.simulator(WINDOW);
    assert_eq!(sim.cancel("k").await, Ok(CancelOutcome::Canceled));

    clock.advance(WINDOW - SECOND);
    assert_eq!(
        sim.submit(request("k", "tok_visa")).await,
        ChargeAnswer::KeyCanceled
    );

    clock.advance(SECOND * 2);
    let charge = sim.charge(request("k", "tok_visa")).await;
    assert!(charge.is_ok(), "{charge:?}");
}

#[tokio::test]
async fn refunds_payouts_and_report_changes_are_forgotten_with_their_keys() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = clock.simulator(WINDOW);
    let charge = sim
        .charge(request("c", "tok_visa"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let refund = sim.refund(refund_of("r", &charge.id)).await;
    let paid = sim.payout(payout("p")).await;
    let refund = refund.unwrap_or_else(|e| panic!("{e}"));
    assert!(paid.is_ok(), "{paid:?}");
    assert_eq!(sim.drop_from_report(&refund.id), Ok(()));

    clock.advance(WINDOW + SECOND);
    assert_eq!(sim.find_refund("r").await, Ok(None));
    assert_eq!(sim.find_payout("p").await, Ok(None));
    assert!(lock(&sim.state).report.is_empty());
    assert_eq!(
        sim.drop_from_report(&refund.id),
        Err(UnknownProcessorId {
            processor_id: refund.id.clone()
        })
    );
}

/// 10,000 charges (and refunds and payouts) fill the books; once their window has passed, the
/// next call finds only itself remembered: memory follows the traffic within the window.
#[tokio::test]
async fn memory_holds_only_the_keys_within_the_window() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = clock.simulator(WINDOW);
    for i in 0..10_000 {
        let charge = sim.charge(request(&format!("c{i}"), "tok_visa")).await;
        let charge = charge.unwrap_or_else(|e| panic!("{e}"));
        if i % 10 == 0 {
            let refund = sim.refund(refund_of(&format!("r{i}"), &charge.id)).await;
            let paid = sim.payout(payout(&format!("p{i}"))).await;
            assert!(refund.is_ok() && paid.is_ok(), "{refund:?} {paid:?}");
        }
        if i % 1_000 == 0 {
            clock.advance(SECOND);
        }
    }
    let full = Remembered {
        charges: (10_000, 10_000),
        refunds: (1_000, 1_000),
        payouts: (1_000, 1_000),
        refundable: 10_000,
        ..Remembered::default()
    };
    assert_eq!(remembered(&sim), full);

    clock.advance(WINDOW + SECOND);
    let within = sim
        .charge(request("within", "tok_visa"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let refund = sim.refund(refund_of("within", &within.id)).await;
    assert!(refund.is_ok(), "{refund:?}");
    assert_eq!(
        remembered(&sim),
        Remembered {
            charges: (1, 1),
            refunds: (1, 1),
            refundable: 1,
            ..Remembered::default()
        }
    );
    assert_eq!(sim.charges_created(), 10_001);
}

/// Three authorisations (one held, one captured, one voided) and their capture and void are
/// forgotten once the window has passed: an authorisation's capture state goes with it, so
/// that nothing can capture, void or refund it any more.
#[tokio::test]
async fn an_authorisation_is_forgotten_with_its_capture_state() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = clock.simulator(WINDOW);
    let mut authorized = Vec::new();
    for key in ["held", "captured", "voided"] {
        let authorization = sim.authorize(request(key, "tok_visa")).await;
        authorized.push(authorization.unwrap_or_else(|e| panic!("{e}")));
    }
    let [held, captured, voided] = &authorized[..] else {
        panic!("three authorisations");
    };
    let capture = sim.capture(capture_of("c", &captured.id)).await;
    let void = sim.void(void_of("v", &voided.id)).await;
    assert!(capture.is_ok() && void.is_ok(), "{capture:?} {void:?}");
    let within = Remembered {
        charges: (3, 3),
        captures: (1, 1),
        voids: (1, 1),
        refundable: 3,
        capturable: 3,
        ..Remembered::default()
    };
    assert_eq!(remembered(&sim), within);

    clock.advance(WINDOW + SECOND);
    assert_eq!(remembered(&sim), Remembered::default());
    let capture = sim.capture(capture_of("c2", &held.id)).await;
    let void = sim.void(void_of("v2", &held.id)).await;
    let refund = sim.refund(refund_of("r", &captured.id)).await;
    assert_eq!(decline_code(&capture), Some(decline::NOT_CAPTURABLE));
    assert_eq!(decline_code(&void), Some(decline::NOT_CAPTURABLE));
    assert_eq!(decline_code(&refund), Some("no_such_charge"));
    assert_eq!(
        (
            sim.authorizations_created(),
            sim.captures_created(),
            sim.voids_created()
        ),
        (3, 1, 1)
    );
}
