//! One test per refund rule: a refund key settles by exactly the protocol of a charge key, and
//! no interleaving of refunds gives back more than the charge took.

use payments_domain::{ProcessorRefundRequest, ProcessorRefundStatus};

use super::*;

/// A 1.00 USD charge with `token`, made under a key of its own; it must succeed.
async fn charge(sim: &InMemoryCardProcessor, token: &str) -> ProcessorCharge {
    sim.charge(request(&format!("charge-{token}"), token))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
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
async fn the_same_key_returns_the_same_refund_and_refunds_once() {
    let sim = InMemoryCardProcessor::default();
    let charge = charge(&sim, "tok_visa").await;
    // Refund keys are a namespace of their own: a charge key of the same name is no answer.
    let request = refund_of("charge-tok_visa", &charge.id, usd(40));
    let first = sim.refund(request.clone()).await;
    let second = sim.refund(request).await;

    let refund = first.unwrap_or_else(|e| panic!("{e}"));
    assert!(refund.id.starts_with("re_"), "{}", refund.id);
    assert_eq!(refund.processor_charge_id, charge.id);
    assert_eq!(refund.money, usd(40));
    assert_eq!(refund.status, ProcessorRefundStatus::Succeeded);
    assert_eq!(second, Ok(refund.clone()));
    assert_eq!(sim.find_refund("charge-tok_visa").await, Ok(Some(refund)));
    assert_eq!(sim.refunds_created(), 1);
    assert_eq!(sim.charges_created(), 1);
}

/// Twenty refunds of a tenth of the charge race under twenty keys. Each processes for
/// `LATENCY`, so all of them begin before any settles: only the reservation made as each one
/// begins can stop the eleventh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_refunds_under_different_keys_never_refund_more_than_the_charge() {
    let sim = Arc::new(InMemoryCardProcessor::with_latency(LATENCY));
    let charge = charge(&sim, "tok_visa").await;
    let refunds: Vec<_> = (0..20)
        .map(|i| {
            let (sim, request) = (
                Arc::clone(&sim),
                refund_of(&format!("r{i}"), &charge.id, usd(10)),
            );
            tokio::spawn(async move { sim.refund(request).await })
        })
        .collect();

    let (mut refunded, mut too_large) = (0, 0);
    for refund in refunds {
        match refund.await.unwrap_or_else(|e| panic!("{e}")) {
            Ok(refund) => {
                assert_eq!(refund.money, usd(10));
                refunded += 1;
            }
            declined if decline_code(&declined) == Some("amount_too_large") => too_large += 1,
            other => panic!("unexpected answer: {other:?}"),
        }
    }
    assert_eq!((refunded, too_large), (10, 10));
    assert_eq!(sim.refunds_created(), 10);
}

/// In order, on one 1.00 charge: each refund is checked against what remains, and a declined
/// one takes nothing away.
#[tokio::test]
async fn a_refund_larger_than_what_remains_is_declined_and_reserves_nothing() {
    let sim = InMemoryCardProcessor::default();
    let charge = charge(&sim, "tok_visa").await;
    let too_large = Some("amount_too_large");
    let steps = [
        ("a", 60, None),
        ("b", 50, too_large),
        ("c", 40, None),
        ("d", 1, too_large),
    ];

    for (key, minor_units, declined) in steps {
        let result = sim
            .refund(refund_of(key, &charge.id, usd(minor_units)))
            .await;
        assert_eq!(decline_code(&result), declined, "{key}: {result:?}");
        assert_eq!(result.is_ok(), declined.is_none(), "{key}: {result:?}");
    }
    assert_eq!(sim.refunds_created(), 2);
}

#[tokio::test]
async fn a_refund_of_an_unknown_charge_or_in_another_currency_is_declined() {
    let sim = InMemoryCardProcessor::default();
    let charge = charge(&sim, "tok_visa").await;
    let euros = Money::new(usd(10).amount, Currency::Eur);

    let no_such_charge = sim.refund(refund_of("a", "sim_unknown", usd(10))).await;
    let other_currency = sim.refund(refund_of("b", &charge.id, euros)).await;

    assert_eq!(decline_code(&no_such_charge), Some("no_such_charge"));
    assert_eq!(decline_code(&other_currency), Some("currency_mismatch"));
    assert_eq!(sim.find_refund("a").await, Ok(None));
    // Neither reserved anything: the whole charge can still be refunded.
    assert!(
        sim.refund(refund_of("c", &charge.id, usd(100)))
            .await
            .is_ok()
    );
    assert_eq!(sim.refunds_created(), 1);
}

#[tokio::test]
async fn tok_refund_declined_charges_but_declines_every_refund_the_same_way() {
    let sim = InMemoryCardProcessor::default();
    let charge = charge(&sim, "tok_refundDeclined").await;
    assert_eq!(charge.status, ProcessorChargeStatus::Succeeded);

    for _ in 0..2 {
        let result = sim.refund(refund_of("r", &charge.id, usd(10))).await;
        assert_eq!(
            result,
            Err(ProcessorError::Declined {
                decline_code: "refund_declined".into(),
                message: "The refund was declined.".into(),
            })
        );
    }
    assert_eq!(sim.refunds_created(), 0);
    assert_eq!(sim.charges_created(), 1);
}

/// Two refunds start at once: the caller of one waits, the caller of the other goes away.
/// Neither exists until its latency has passed, and then both do.
#[tokio::test]
async fn a_refund_exists_only_after_its_latency_whether_or_not_its_caller_waits() {
    let sim = InMemoryCardProcessor::with_latency(LATENCY);
    let charge = charge(&sim, "tok_visa").await;
    let began = Instant::now();
    let mut waited = Box::pin(sim.refund(refund_of("waited", &charge.id, usd(10))));
    let mut abandoned = Box::pin(sim.refund(refund_of("abandoned", &charge.id, usd(20))));
    start(&mut waited).await;
    start(&mut abandoned).await;
    drop(abandoned);
    // Long enough for the processing tasks to run, well within the latency.
    tokio::time::sleep(LATENCY / 4).await;

    // Processing: nothing to find, nothing to cancel, and no second call under either key.
    for key in ["waited", "abandoned"] {
        assert_eq!(sim.find_refund(key).await, Ok(None));
        let cancel = sim.cancel_refund(key).await;
        assert_eq!(cancel, Ok(CancelOutcome::StillProcessing));
        let second = sim.submit_refund(refund_of(key, &charge.id, usd(10))).await;
        assert_eq!(second, RefundAnswer::Processing);
    }
    assert_eq!(sim.refunds_created(), 0);

    let refund = waited.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(began.elapsed() >= LATENCY, "{:?}", began.elapsed());
    assert_eq!(sim.find_refund("waited").await, Ok(Some(refund.clone())));
    let repeated = sim.refund(refund_of("waited", &charge.id, usd(10))).await;
    assert_eq!(repeated, Ok(refund));

    tokio::time::sleep(LATENCY).await;
    let abandoned = sim.find_refund("abandoned").await;
    assert_eq!(abandoned.map(|r| r.map(|r| r.money)), Ok(Some(usd(20))));
    assert_eq!(sim.refunds_created(), 2);
}

/// Without any configured latency, a refund of a `tok_slow` charge still processes for
/// [`TestToken::SLOW_LATENCY`]: the latency comes from the charge's token.
#[tokio::test]
async fn a_refund_processes_as_long_as_a_call_with_its_charges_token() {
    let sim = InMemoryCardProcessor::default();
    let fast = charge(&sim, "tok_visa").await;
    // Made refundable directly, so as not to wait out the slow charge itself.
    let slow = ProcessorCharge {
        id: "sim_slow".into(),
        ..fast.clone()
    };
    lock(&sim.state)
        .refundable
        .add(&slow, TestToken::SucceedsSlowly);

    let mut call = Box::pin(sim.refund(refund_of("slow", &slow.id, usd(10))));
    start(&mut call).await;
    tokio::time::sleep(LATENCY).await;

    // A refund of the fast charge, begun later, settles at once.
    assert!(
        sim.refund(refund_of("fast", &fast.id, usd(10)))
            .await
            .is_ok()
    );
    assert_eq!(sim.find_refund("slow").await, Ok(None));
    assert_eq!(sim.refunds_created(), 1);
}

#[tokio::test]
async fn cancel_of_an_unused_refund_key_tombstones_it_for_good() {
    let sim = InMemoryCardProcessor::default();
    let charge = charge(&sim, "tok_visa").await;
    assert_eq!(sim.cancel_refund("r").await, Ok(CancelOutcome::Canceled));

    assert_eq!(
        sim.submit_refund(refund_of("r", &charge.id, usd(10))).await,
        RefundAnswer::KeyCanceled
    );
    let refund = sim.refund(refund_of("r", &charge.id, usd(10))).await;
    assert!(is_unavailable(&refund), "{refund:?}");
    assert_eq!(sim.find_refund("r").await, Ok(None));
    assert_eq!(sim.cancel_refund("r").await, Ok(CancelOutcome::Canceled));
    assert_eq!(sim.refunds_created(), 0);
    // A canceled refund key is not a canceled charge key.
    assert_eq!(
        sim.cancel("charge-tok_visa").await,
        Ok(CancelOutcome::Exists(charge))
    );
}

#[tokio::test]
async fn cancel_of_a_refunded_key_returns_the_refund_and_keeps_it() {
    let sim = InMemoryCardProcessor::default();
    let charge = charge(&sim, "tok_visa").await;
    let refund = sim
        .refund(refund_of("r", &charge.id, usd(10)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        sim.cancel_refund("r").await,
        Ok(CancelOutcome::Exists(refund.clone()))
    );
    let repeated = sim.refund(refund_of("r", &charge.id, usd(10))).await;
    assert_eq!(repeated, Ok(refund));
    assert_eq!(sim.refunds_created(), 1);
}
