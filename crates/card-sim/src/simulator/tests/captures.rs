//! One test per capture and void rule: an authorisation is captured or voided at most once,
//! whatever races, under keys that settle by exactly the protocol of a charge key; and it gives
//! back nothing until captured, then no more than its capture took.

use payments_domain::{
    ProcessorCaptureRequest, ProcessorRefundRequest, ProcessorVoid, ProcessorVoidRequest,
    SettlementKind, decline,
};

use super::*;

/// A 1.00 USD authorisation with `token` under `key`; it must succeed.
async fn authorized(sim: &InMemoryCardProcessor, key: &str, token: &str) -> ProcessorCharge {
    sim.authorize(request(key, token))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn capture_of(key: &str, charge_id: &str, money: Money) -> ProcessorCaptureRequest {
    ProcessorCaptureRequest {
        idempotency_key: key.into(),
        processor_charge_id: charge_id.into(),
        money,
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

fn refund_of(key: &str, charge_id: &str, money: Money) -> ProcessorRefundRequest {
    ProcessorRefundRequest {
        idempotency_key: key.into(),
        processor_charge_id: charge_id.into(),
        money,
        metadata: metadata(&format!("re_{key}")),
    }
}

#[tokio::test]
async fn an_authorisation_requires_capture_and_shares_the_charge_keys() {
    let sim = InMemoryCardProcessor::default();
    let authorization = authorized(&sim, "k", "tok_visa").await;
    assert_eq!(authorization.status, ProcessorChargeStatus::RequiresCapture);
    assert_eq!(authorization.money, usd(100));
    assert!(authorization.id.starts_with("sim_"), "{}", authorization.id);

    // One key space: a charge under the key, a lookup and a cancel all answer with it.
    let charge = sim.charge(request("k", "tok_visa")).await;
    assert_eq!(charge, Ok(authorization.clone()));
    assert_eq!(sim.find_charge("k").await, Ok(Some(authorization.clone())));
    let canceled = sim.cancel("k").await;
    assert_eq!(canceled, Ok(CancelOutcome::Exists(authorization)));

    // The token rules are the charge's.
    let declined = sim.authorize(request("no", "tok_chargeDeclined")).await;
    assert_eq!(decline_code(&declined), Some("generic_decline"));
    let failed = sim.authorize(request("err", "tok_processingError")).await;
    assert!(is_unavailable(&failed), "{failed:?}");
    assert_eq!(sim.authorizations_created(), 1);
    assert_eq!(sim.charges_created(), 1);
}

/// A capture and a void race on each of a hundred authorisations, across threads, either
/// spawned first: exactly one of them succeeds, and the other is declined with the code that
/// names the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_and_a_void_racing_on_one_authorisation_exactly_one_succeeds() {
    let sim = Arc::new(InMemoryCardProcessor::default());
    let mut races = Vec::new();
    for i in 0..100 {
        let authorization = authorized(&sim, &format!("a{i}"), "tok_visa").await;
        let capture = capture_of(&format!("c{i}"), &authorization.id, usd(100));
        let void = void_of(&format!("v{i}"), &authorization.id);
        let (capturing, voiding) = (Arc::clone(&sim), Arc::clone(&sim));
        let capture = async move { capturing.capture(capture).await };
        let void = async move { voiding.void(void).await };
        let race = if i % 2 == 0 {
            let void = tokio::spawn(void);
            (tokio::spawn(capture), void)
        } else {
            (tokio::spawn(capture), tokio::spawn(void))
        };
        races.push(race);
    }

    let (mut captured, mut voided) = (0, 0);
    for (capture, void) in races {
        let capture = capture.await.unwrap_or_else(|e| panic!("{e}"));
        let void = void.await.unwrap_or_else(|e| panic!("{e}"));
        match (decline_code(&capture), decline_code(&void)) {
            (None, Some(decline::ALREADY_CAPTURED)) if capture.is_ok() => captured += 1,
            (Some(decline::CANCELED), None) if void.is_ok() => voided += 1,
            _ => panic!("inconsistent answers: {capture:?} {void:?}"),
        }
    }
    assert_eq!(captured + voided, 100);
    assert_eq!(sim.captures_created(), captured);
    assert_eq!(sim.voids_created(), voided);
}

/// The capture is within its latency, and does not exist yet; the authorisation is captured
/// already, so a void begun meanwhile is declined, and a second capture too.
#[tokio::test]
async fn a_capture_in_flight_already_refuses_a_void_and_another_capture() {
    let sim = InMemoryCardProcessor::with_latency(LATENCY);
    let authorization = authorized(&sim, "a", "tok_visa").await;
    let mut capture = Box::pin(sim.capture(capture_of("c", &authorization.id, usd(100))));
    start(&mut capture).await;

    // Each is decided as it begins; its answer, a decline, comes after its own latency.
    let mut void = Box::pin(sim.void(void_of("v", &authorization.id)));
    let mut second = Box::pin(sim.capture(capture_of("c2", &authorization.id, usd(1))));
    start(&mut void).await;
    start(&mut second).await;
    assert_eq!(
        sim.cancel_capture("c").await,
        Ok(CancelOutcome::StillProcessing)
    );
    assert_eq!(sim.captures_created(), 0);

    assert_eq!(decline_code(&void.await), Some(decline::ALREADY_CAPTURED));
    assert_eq!(decline_code(&second.await), Some(decline::ALREADY_CAPTURED));
    let capture = capture.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(capture.money, usd(100));
    assert_eq!(sim.captures_created(), 1);
    assert_eq!(sim.voids_created(), 0);
}

/// Ten captures under ten keys, all in flight at once: one captures, nine are declined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_captures_under_different_keys_capture_once() {
    let sim = Arc::new(InMemoryCardProcessor::with_latency(LATENCY));
    let authorization = authorized(&sim, "a", "tok_visa").await;
    let captures: Vec<_> = (0..10)
        .map(|i| {
            let sim = Arc::clone(&sim);
            let request = capture_of(&format!("c{i}"), &authorization.id, usd(50 + i));
            tokio::spawn(async move { sim.capture(request).await })
        })
        .collect();

    let (mut captured, mut refused) = (Vec::new(), 0);
    for capture in captures {
        let capture = capture.await.unwrap_or_else(|e| panic!("{e}"));
        match decline_code(&capture) {
            None => captured.push(capture.unwrap_or_else(|e| panic!("{e}"))),
            Some(decline::ALREADY_CAPTURED) => refused += 1,
            Some(other) => panic!("unexpected decline {other}"),
        }
    }
    assert_eq!((captured.len(), refused), (1, 9));
    assert_eq!(sim.captures_created(), 1);
    // What is refundable is what that one capture took.
    let took = captured[0].money.amount.minor_units();
    let refund = sim
        .refund(refund_of("r", &authorization.id, usd(took + 1)))
        .await;
    assert_eq!(decline_code(&refund), Some("amount_too_large"));
}

#[tokio::test]
async fn a_capture_above_the_authorised_amount_is_declined_and_changes_nothing() {
    let sim = InMemoryCardProcessor::default();
    let authorization = authorized(&sim, "a", "tok_visa").await;
    let euros = Money::new(usd(100).amount, Currency::Eur);

    let too_large = sim
        .capture(capture_of("c1", &authorization.id, usd(101)))
        .await;
    let other_currency = sim
        .capture(capture_of("c2", &authorization.id, euros))
        .await;
    assert_eq!(decline_code(&too_large), Some(decline::AMOUNT_TOO_LARGE));
    assert_eq!(decline_code(&other_currency), Some(decline::NOT_CAPTURABLE));
    assert_eq!(sim.cancel_capture("c1").await, Ok(CancelOutcome::Canceled));
    assert_eq!(sim.captures_created(), 0);

    // Still held: nothing to refund, and all of it still to capture.
    let refund = sim.refund(refund_of("r", &authorization.id, usd(1))).await;
    assert_eq!(decline_code(&refund), Some("charge_not_captured"));
    let all = sim
        .capture(capture_of("c3", &authorization.id, usd(100)))
        .await;
    assert_eq!(all.map(|c| c.money), Ok(usd(100)));
    assert_eq!(sim.captures_created(), 1);
}

#[tokio::test]
async fn a_refund_of_an_uncaptured_authorisation_is_declined() {
    let sim = InMemoryCardProcessor::default();
    let held = authorized(&sim, "held", "tok_visa").await;
    let voided = authorized(&sim, "voided", "tok_visa").await;
    assert!(sim.void(void_of("v", &voided.id)).await.is_ok());

    for (key, authorization) in [("r1", &held), ("r2", &voided)] {
        let refund = sim.refund(refund_of(key, &authorization.id, usd(1))).await;
        assert_eq!(decline_code(&refund), Some("charge_not_captured"), "{key}");
    }
    assert_eq!(sim.refunds_created(), 0);
    // A voided authorisation can never be captured.
    let capture = sim.capture(capture_of("c", &voided.id, usd(100))).await;
    assert_eq!(decline_code(&capture), Some(decline::CANCELED));
}

/// Captured 60 of 100: refunds draw on the 60, never on the 100 authorised.
#[tokio::test]
async fn after_a_partial_capture_refunds_are_limited_to_the_captured_amount() {
    let sim = InMemoryCardProcessor::default();
    let authorization = authorized(&sim, "a", "tok_visa").await;
    let capture = sim
        .capture(capture_of("c", &authorization.id, usd(60)))
        .await;
    assert_eq!(capture.map(|c| c.money), Ok(usd(60)));

    let too_large = Some("amount_too_large");
    for (key, minor_units, declined) in [("a", 61, too_large), ("b", 60, None), ("c", 1, too_large)]
    {
        let result = sim
            .refund(refund_of(key, &authorization.id, usd(minor_units)))
            .await;
        assert_eq!(decline_code(&result), declined, "{key}: {result:?}");
        assert_eq!(result.is_ok(), declined.is_none(), "{key}: {result:?}");
    }
    assert_eq!(sim.refunds_created(), 1);
    // The rest of the hold is released: no second capture takes it.
    let rest = sim
        .capture(capture_of("c2", &authorization.id, usd(40)))
        .await;
    assert_eq!(decline_code(&rest), Some(decline::ALREADY_CAPTURED));
}

#[tokio::test]
async fn a_repeat_under_the_same_key_returns_the_same_capture_and_void() {
    let sim = InMemoryCardProcessor::default();
    let authorization = authorized(&sim, "a", "tok_visa").await;
    let first = sim
        .capture(capture_of("c", &authorization.id, usd(70)))
        .await;
    // The same key answers as before, whatever the repeat asks.
    let second = sim
        .capture(capture_of("c", &authorization.id, usd(5)))
        .await;

    let capture = first.unwrap_or_else(|e| panic!("{e}"));
    assert!(capture.id.starts_with("cap_"), "{}", capture.id);
    assert_eq!(capture.processor_charge_id, authorization.id);
    assert_eq!(capture.confirms(&authorization.id, usd(70)), Ok(()));
    assert_eq!(second, Ok(capture.clone()));
    let canceled = sim.cancel_capture("c").await;
    assert_eq!(canceled, Ok(CancelOutcome::Exists(capture)));
    assert_eq!(sim.captures_created(), 1);

    let other = authorized(&sim, "b", "tok_visa").await;
    let void = sim.void(void_of("v", &other.id)).await;
    let void = void.unwrap_or_else(|e| panic!("{e}"));
    assert!(void.id.starts_with("void_"), "{}", void.id);
    assert_eq!(void.confirms(&other.id, other.money), Ok(()));
    assert_eq!(sim.void(void_of("v", &other.id)).await, Ok(void.clone()));
    assert_eq!(sim.cancel_void("v").await, Ok(CancelOutcome::Exists(void)));
    assert_eq!(sim.voids_created(), 1);
}

#[tokio::test]
async fn cancel_capture_and_cancel_void_of_an_unknown_key_tombstone_it() {
    let sim = InMemoryCardProcessor::default();
    let authorization = authorized(&sim, "a", "tok_visa").await;
    assert_eq!(sim.cancel_capture("c").await, Ok(CancelOutcome::Canceled));
    assert_eq!(sim.cancel_void("v").await, Ok(CancelOutcome::Canceled));

    let capture = capture_of("c", &authorization.id, usd(100));
    assert_eq!(
        sim.submit_capture(capture.clone()).await,
        CaptureAnswer::KeyCanceled
    );
    assert!(is_unavailable(&sim.capture(capture).await));
    let void = void_of("v", &authorization.id);
    assert_eq!(sim.submit_void(void.clone()).await, VoidAnswer::KeyCanceled);
    assert!(is_unavailable(&sim.void(void).await));
    assert_eq!(sim.cancel_capture("c").await, Ok(CancelOutcome::Canceled));
    assert_eq!((sim.captures_created(), sim.voids_created()), (0, 0));

    // Neither touched the authorisation, and capture and void keys are their own kinds: the
    // same name under the other kind is a new key.
    let captured = sim
        .capture(capture_of("v", &authorization.id, usd(100)))
        .await;
    assert!(captured.is_ok(), "{captured:?}");
    let canceled = sim.cancel_void("c").await;
    assert_eq!(canceled, Ok(CancelOutcome::<ProcessorVoid>::Canceled));
}

#[tokio::test]
async fn a_charge_captured_when_it_was_made_or_an_unknown_one_is_not_capturable() {
    let sim = InMemoryCardProcessor::default();
    let charge = sim
        .charge(request("k", "tok_visa"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for (i, charge_id) in [charge.id.as_str(), "sim_unknown"].into_iter().enumerate() {
        let (capture_key, void_key) = (format!("c{i}"), format!("v{i}"));
        let capture = sim
            .capture(capture_of(&capture_key, charge_id, usd(100)))
            .await;
        let void = sim.void(void_of(&void_key, charge_id)).await;
        assert_eq!(
            decline_code(&capture),
            Some(decline::NOT_CAPTURABLE),
            "{charge_id}"
        );
        assert_eq!(
            decline_code(&void),
            Some(decline::NOT_CAPTURABLE),
            "{charge_id}"
        );
        // Declined, the keys made nothing: a cancel tombstones them.
        let canceled = sim.cancel_capture(&capture_key).await;
        assert_eq!(canceled, Ok(CancelOutcome::Canceled));
        assert_eq!(
            sim.cancel_void(&void_key).await,
            Ok(CancelOutcome::Canceled)
        );
    }
    assert_eq!((sim.captures_created(), sim.voids_created()), (0, 0));
    assert_eq!(sim.authorizations_created(), 0);
}

/// Without any configured latency, a capture or a void of a `tok_slow` authorisation still
/// processes for [`TestToken::SLOW_LATENCY`]: the latency comes from the authorisation's token.
#[tokio::test]
async fn captures_and_voids_process_as_long_as_a_call_with_the_authorisations_token() {
    let sim = InMemoryCardProcessor::default();
    let fast = authorized(&sim, "fast", "tok_visa").await;
    let fast_too = authorized(&sim, "fast-too", "tok_visa").await;
    // Made capturable directly, so as not to wait out the slow authorisations themselves.
    let (slow, slow_too) = {
        let mut state = lock(&sim.state);
        let mut slow = |id: &str| {
            let slow = ProcessorCharge {
                id: id.into(),
                ..fast.clone()
            };
            state.refundable.add(&slow, TestToken::SucceedsSlowly);
            state.capturable.add(&slow, TestToken::SucceedsSlowly);
            slow
        };
        (slow("sim_slow"), slow("sim_slow_too"))
    };

    let mut capture = Box::pin(sim.capture(capture_of("slow", &slow.id, usd(100))));
    let mut void = Box::pin(sim.void(void_of("slow", &slow_too.id)));
    start(&mut capture).await;
    start(&mut void).await;
    tokio::time::sleep(LATENCY).await;

    // Those of the fast authorisations, begun later, settle at once.
    assert!(
        sim.capture(capture_of("fast", &fast.id, usd(100)))
            .await
            .is_ok()
    );
    assert!(sim.void(void_of("fast", &fast_too.id)).await.is_ok());
    assert_eq!(
        sim.cancel_capture("slow").await,
        Ok(CancelOutcome::StillProcessing)
    );
    assert_eq!(
        sim.cancel_void("slow").await,
        Ok(CancelOutcome::StillProcessing)
    );
    assert_eq!((sim.captures_created(), sim.voids_created()), (1, 1));
}

/// The settlement report lists an authorisation as a charge of what it holds (its status
/// `requires_capture`), and what ended it as a line of its own: a capture of what it took, a void
/// of what it released, each under its own processor id and key, after its authorisation.
#[tokio::test]
async fn the_report_lists_authorisations_as_charges_then_their_captures_and_voids() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = clock.simulator(TimeDelta::days(7));
    let captured = authorized(&sim, "a", "tok_visa").await;
    let voided = authorized(&sim, "b", "tok_visa").await;
    let capture = sim
        .capture(capture_of("c", &captured.id, usd(50)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let void = sim
        .void(void_of("v", &voided.id))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let lines = sim.settlement_lines(clock.now().date_naive());
    let listed: Vec<_> = lines
        .iter()
        .map(|line| {
            (
                line.kind,
                line.processor_id.as_str(),
                line.processor_key.as_str(),
                line.status,
                line.money,
            )
        })
        .collect();
    let held = ProcessorChargeStatus::RequiresCapture;
    let done = ProcessorChargeStatus::Succeeded;
    assert_eq!(
        listed,
        [
            (
                SettlementKind::Charge,
                captured.id.as_str(),
                "a",
                held,
                usd(100)
            ),
            (
                SettlementKind::Charge,
                voided.id.as_str(),
                "b",
                held,
                usd(100)
            ),
            (
                SettlementKind::Capture,
                capture.id.as_str(),
                "c",
                done,
                usd(50)
            ),
            (SettlementKind::Void, void.id.as_str(), "v", done, usd(100)),
        ]
    );

    // A test can leave a capture or a void out of the report, as any other line.
    assert_eq!(sim.drop_from_report(&capture.id), Ok(()));
    assert_eq!(sim.drop_from_report(&void.id), Ok(()));
    let kinds: Vec<_> = sim
        .settlement_lines(clock.now().date_naive())
        .into_iter()
        .map(|line| line.kind)
        .collect();
    assert_eq!(kinds, [SettlementKind::Charge, SettlementKind::Charge]);
}
