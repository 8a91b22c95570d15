//! One test per payout rule: a payout key settles by exactly the protocol of a charge key, and
//! a test bank account chooses the outcome.

use payments_domain::{Destination, ProcessorPayoutRequest, ProcessorPayoutStatus};

use super::*;

fn payout(key: &str, destination: &str) -> ProcessorPayoutRequest {
    ProcessorPayoutRequest {
        idempotency_key: key.into(),
        money: usd(2500),
        destination: Destination::new(destination).unwrap_or_else(|e| panic!("{e}")),
        metadata: metadata(&format!("po_{key}")),
    }
}

#[tokio::test]
async fn the_same_key_returns_the_same_payout_and_pays_once() {
    let sim = InMemoryCardProcessor::default();
    let first = sim.payout(payout("p", "ba_checking")).await;
    let second = sim.payout(payout("p", "ba_checking")).await;

    let paid = first.unwrap_or_else(|e| panic!("{e}"));
    assert!(paid.id.starts_with("po_"), "{}", paid.id);
    assert_eq!(paid.destination, "ba_checking");
    assert_eq!(paid.money, usd(2500));
    assert_eq!(paid.status, ProcessorPayoutStatus::Succeeded);
    assert_eq!(second, Ok(paid.clone()));
    assert_eq!(sim.find_payout("p").await, Ok(Some(paid)));
    assert_eq!(sim.payouts_created(), 1);
    // Payout keys are a namespace of their own.
    assert_eq!(sim.find_charge("p").await, Ok(None));
    assert_eq!(sim.charges_created(), 0);
}

#[tokio::test]
async fn a_payout_to_ba_declined_is_declined_for_good_and_pays_nothing() {
    let sim = InMemoryCardProcessor::default();
    for _ in 0..2 {
        let declined = sim.payout(payout("p", "ba_declined")).await;
        assert!(
            matches!(&declined, Err(ProcessorError::Declined { decline_code, .. }) if decline_code == "account_closed"),
            "{declined:?}"
        );
    }
    assert_eq!(sim.find_payout("p").await, Ok(None));
    assert_eq!(sim.payouts_created(), 0);
}

/// A payout exists only once its latency has passed: until then a lookup finds nothing and a
/// cancel says it is still processing, which tombstones nothing.
#[tokio::test]
async fn a_payout_exists_only_after_its_latency() {
    let sim = InMemoryCardProcessor::with_latency(LATENCY);
    let began = Instant::now();
    let mut call = Box::pin(sim.payout(payout("p", "ba_checking")));
    start(&mut call).await;

    assert_eq!(sim.find_payout("p").await, Ok(None));
    assert_eq!(
        sim.cancel_payout("p").await,
        Ok(CancelOutcome::StillProcessing)
    );
    assert!(is_unavailable(
        &sim.payout(payout("p", "ba_checking")).await
    ));
    assert_eq!(sim.payouts_created(), 0);

    let paid = call.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(began.elapsed() >= LATENCY);
    assert_eq!(
        sim.cancel_payout("p").await,
        Ok(CancelOutcome::Exists(paid))
    );
    assert_eq!(sim.payouts_created(), 1);
}

#[test]
fn ba_slow_processes_for_the_slow_latency_more() {
    let sim = InMemoryCardProcessor::with_latency(LATENCY);
    let latency_to =
        |destination| sim.payout_latency(TestDestination::from_destination(destination));
    assert_eq!(latency_to("ba_checking"), LATENCY);
    assert_eq!(latency_to("ba_declined"), LATENCY);
    assert_eq!(latency_to("ba_slow"), LATENCY + TestToken::SLOW_LATENCY);
}

#[tokio::test]
async fn cancel_of_an_unused_payout_key_tombstones_it_for_good() {
    let sim = InMemoryCardProcessor::default();
    assert_eq!(sim.cancel_payout("p").await, Ok(CancelOutcome::Canceled));
    for _ in 0..2 {
        assert!(is_unavailable(
            &sim.payout(payout("p", "ba_checking")).await
        ));
    }
    assert_eq!(sim.cancel_payout("p").await, Ok(CancelOutcome::Canceled));
    assert_eq!(sim.payouts_created(), 0);
}

/// Arc'd and raced: a cancel and a payout under one key end in exactly one of two states,
/// never both and never neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_a_payout_is_atomic() {
    for round in 0..50 {
        let sim = Arc::new(InMemoryCardProcessor::default());
        let key = format!("p-{round}");
        let paying = {
            let (sim, key) = (Arc::clone(&sim), key.clone());
            tokio::spawn(async move { sim.payout(payout(&key, "ba_checking")).await })
        };
        let canceled = sim.cancel_payout(&key).await;
        let paid = paying.await.unwrap_or_else(|e| panic!("{e}"));
        match (canceled, paid) {
            (Ok(CancelOutcome::Canceled), paid) => {
                assert!(is_unavailable(&paid), "{paid:?}");
                assert_eq!(sim.payouts_created(), 0);
            }
            (Ok(CancelOutcome::StillProcessing), Ok(_)) => assert_eq!(sim.payouts_created(), 1),
            (Ok(CancelOutcome::Exists(found)), Ok(paid)) => {
                assert_eq!(found, paid);
                assert_eq!(sim.payouts_created(), 1);
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
}
