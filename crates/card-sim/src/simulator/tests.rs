//! One test per rule of the simulator, the charge rules here and the refund, capture and void,
//! and payout rules in [`refunds`], [`captures`] and [`payouts`], the key window in
//! [`key_window`] and the settlement report in [`settlement`]. Latencies are real but short
//! (the workspace's tokio has no paused clock); a call is started by polling it once, which
//! registers its key deterministically, instead of by sleeping. Dates and the key window read
//! a [`ManualClock`], which a test moves by hand.

mod captures;
mod key_window;
mod payouts;
mod refunds;
mod settlement;

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, TimeZone, Utc};

use payments_domain::{
    Amount, CardProcessor, Currency, Money, PaymentSource, PayoutProcessor, ProcessorChargeRequest,
    ProcessorChargeStatus, ProcessorMetadata, ProcessorMismatch, TenantId,
};

use super::*;

const LATENCY: Duration = Duration::from_millis(200);

fn usd(minor_units: i64) -> Money {
    Money::new(
        Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}")),
        Currency::Usd,
    )
}

/// The metadata of the service's resource `resource_id` of the tenant `acme`.
fn metadata(resource_id: &str) -> ProcessorMetadata {
    ProcessorMetadata::new(TenantId::new("acme"), resource_id)
}

/// A 1.00 USD charge with `token` under `key`, whose metadata names `ch_<key>`.
fn request(key: &str, token: &str) -> ProcessorChargeRequest {
    ProcessorChargeRequest {
        idempotency_key: key.into(),
        money: usd(100),
        source: PaymentSource::new(token).unwrap_or_else(|e| panic!("{e}")),
        metadata: metadata(&format!("ch_{key}")),
    }
}

/// A clock that moves only when the test moves it.
#[derive(Debug, Clone)]
struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    /// A clock reading `year-month-day hour:00:00` UTC.
    fn at(year: i32, month: u32, day: u32, hour: u32) -> Self {
        let start = Utc
            .with_ymd_and_hms(year, month, day, hour, 0, 0)
            .single()
            .unwrap_or_else(|| panic!("{year}-{month}-{day} {hour}:00 is a valid time"));
        Self(Arc::new(Mutex::new(start)))
    }

    fn now(&self) -> DateTime<Utc> {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn advance(&self, by: TimeDelta) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) += by;
    }

    /// A simulator without latency that reads this clock and remembers keys for `key_window`.
    fn simulator(&self, key_window: TimeDelta) -> InMemoryCardProcessor {
        let clock = self.clone();
        InMemoryCardProcessor::with_clock(
            Duration::ZERO,
            key_window.to_std().unwrap_or_else(|e| panic!("{e}")),
            Clock::from_fn(move || clock.now()),
        )
    }
}

/// Polls `call` once, which registers its key, and checks that it is still waiting.
async fn start<F>(call: &mut F)
where
    F: Future + Unpin,
    F::Output: Debug,
{
    tokio::select! {
        biased;
        output = call => panic!("the call finished before its latency: {output:?}"),
        () = std::future::ready(()) => {}
    }
}

fn is_unavailable<T>(result: &Result<T, ProcessorError>) -> bool {
    matches!(result, Err(ProcessorError::Unavailable { .. }))
}

/// The `decline_code` of a declined call, `None` for any other result.
fn decline_code<T>(result: &Result<T, ProcessorError>) -> Option<&str> {
    match result {
        Err(ProcessorError::Declined { decline_code, .. }) => Some(decline_code.as_str()),
        _ => None,
    }
}

#[tokio::test]
async fn the_same_key_returns_the_same_succeeded_charge_and_creates_one() {
    let sim = InMemoryCardProcessor::default();
    let first = sim.charge(request("k", "tok_visa")).await;
    let second = sim.charge(request("k", "tok_visa")).await;
    assert_eq!(first.as_ref().map(|c| c.money), Ok(usd(100)));
    assert_eq!(
        first.as_ref().map(|c| c.status),
        Ok(ProcessorChargeStatus::Succeeded)
    );
    assert_eq!(first, second);
    assert_eq!(sim.charges_created(), 1);
}

#[tokio::test]
async fn different_keys_create_different_charges() {
    let sim = InMemoryCardProcessor::default();
    let a = sim.charge(request("a", "tok_visa")).await.map(|c| c.id);
    let b = sim
        .charge(request("b", "tok_mastercard"))
        .await
        .map(|c| c.id);
    assert_ne!(a, b);
    assert_eq!(sim.charges_created(), 2);
}

#[tokio::test]
async fn a_decline_is_remembered_and_creates_nothing() {
    let sim = InMemoryCardProcessor::default();
    for _ in 0..2 {
        let result = sim.charge(request("k", "tok_chargeDeclined")).await;
        assert_eq!(
            result,
            Err(ProcessorError::Declined {
                decline_code: "generic_decline".into(),
                message: "The card was declined.".into(),
            })
        );
    }
    assert_eq!(sim.charges_created(), 0);
    assert_eq!(sim.find_charge("k").await, Ok(None));
}

#[tokio::test]
async fn a_processing_error_is_transient_every_time() {
    let sim = InMemoryCardProcessor::default();
    for _ in 0..3 {
        let result = sim.charge(request("k", "tok_processingError")).await;
        assert!(is_unavailable(&result), "{result:?}");
    }
    assert_eq!(sim.charges_created(), 0);
}

#[tokio::test]
async fn fail_once_then_succeeds_under_the_same_key() {
    let sim = InMemoryCardProcessor::default();
    let first = sim.charge(request("k", "tok_processingErrorOnce")).await;
    assert!(is_unavailable(&first), "{first:?}");
    let second = sim.charge(request("k", "tok_processingErrorOnce")).await;
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(sim.find_charge("k").await, Ok(second.ok()));
    assert_eq!(sim.charges_created(), 1);
}

#[tokio::test]
async fn an_amount_mismatch_charges_and_reports_one_minor_unit_more() {
    let sim = InMemoryCardProcessor::default();
    let charge = sim.charge(request("k", "tok_amountMismatch")).await;
    let charge = charge.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(charge.money, usd(101));
    assert_eq!(charge.status, ProcessorChargeStatus::Succeeded);
    assert_eq!(
        charge.confirms(usd(100)),
        Err(ProcessorMismatch::Money {
            id: charge.id.clone(),
            reported: usd(101),
            requested: usd(100),
        })
    );
    assert_eq!(sim.find_charge("k").await, Ok(Some(charge)));
    assert_eq!(sim.charges_created(), 1);
}

#[test]
fn tok_slow_processes_for_the_slow_latency_more() {
    let sim = InMemoryCardProcessor::with_latency(LATENCY);
    assert_eq!(sim.latency_for(TestToken::Succeeds), LATENCY);
    assert_eq!(
        sim.latency_for(TestToken::SucceedsSlowly),
        LATENCY + TestToken::SLOW_LATENCY
    );
}

#[tokio::test]
async fn a_charge_exists_only_after_its_latency() {
    let sim = InMemoryCardProcessor::with_latency(LATENCY);
    let began = Instant::now();
    let mut call = Box::pin(sim.charge(request("k", "tok_visa")));
    start(&mut call).await;
    // Long enough for the processing task to run, well within the latency: a charge settled
    // before its wait would show now.
    tokio::time::sleep(LATENCY / 4).await;

    // Processing: nothing to find, nothing to cancel, and no second call under the key.
    assert_eq!(sim.find_charge("k").await, Ok(None));
    assert_eq!(sim.cancel("k").await, Ok(CancelOutcome::StillProcessing));
    assert_eq!(
        sim.submit(request("k", "tok_visa")).await,
        ChargeAnswer::Processing
    );
    assert_eq!(sim.charges_created(), 0);

    let charge = call.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(began.elapsed() >= LATENCY, "{:?}", began.elapsed());
    assert_eq!(sim.find_charge("k").await, Ok(Some(charge.clone())));
    assert_eq!(sim.charge(request("k", "tok_visa")).await, Ok(charge));
    assert_eq!(sim.charges_created(), 1);
}

#[tokio::test]
async fn a_caller_that_goes_away_does_not_stop_the_charge() {
    let sim = InMemoryCardProcessor::with_latency(LATENCY);
    let mut call = Box::pin(sim.charge(request("k", "tok_visa")));
    start(&mut call).await;
    drop(call);
    assert_eq!(sim.find_charge("k").await, Ok(None));

    tokio::time::sleep(LATENCY * 2).await;
    let found = sim.find_charge("k").await.map(|c| c.map(|c| c.money));
    assert_eq!(found, Ok(Some(usd(100))));
    assert_eq!(sim.charges_created(), 1);
}

#[tokio::test]
async fn cancel_of_an_unknown_key_tombstones_it_for_good() {
    let sim = InMemoryCardProcessor::default();
    assert_eq!(sim.cancel("k").await, Ok(CancelOutcome::Canceled));

    assert_eq!(
        sim.submit(request("k", "tok_visa")).await,
        ChargeAnswer::KeyCanceled
    );
    let charge = sim.charge(request("k", "tok_visa")).await;
    assert!(is_unavailable(&charge), "{charge:?}");
    assert_eq!(sim.find_charge("k").await, Ok(None));
    assert_eq!(sim.cancel("k").await, Ok(CancelOutcome::Canceled));
    assert_eq!(sim.charges_created(), 0);
}

#[tokio::test]
async fn cancel_of_a_charged_key_returns_the_charge_and_keeps_it() {
    let sim = InMemoryCardProcessor::default();
    let charge = sim
        .charge(request("k", "tok_visa"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        sim.cancel("k").await,
        Ok(CancelOutcome::Exists(charge.clone()))
    );
    assert_eq!(sim.charge(request("k", "tok_visa")).await, Ok(charge));
    assert_eq!(sim.charges_created(), 1);
}

#[tokio::test]
async fn cancel_after_a_decline_or_a_transient_failure_tombstones_the_key() {
    let sim = InMemoryCardProcessor::default();
    let declined = sim.charge(request("declined", "tok_chargeDeclined")).await;
    let failed = sim
        .charge(request("failed", "tok_processingErrorOnce"))
        .await;
    assert!(matches!(declined, Err(ProcessorError::Declined { .. })));
    assert!(is_unavailable(&failed), "{failed:?}");

    for key in ["declined", "failed"] {
        assert_eq!(sim.cancel(key).await, Ok(CancelOutcome::Canceled));
    }
    // The retry that would have succeeded is refused.
    assert_eq!(
        sim.submit(request("failed", "tok_processingErrorOnce"))
            .await,
        ChargeAnswer::KeyCanceled
    );
    assert_eq!(
        sim.submit(request("declined", "tok_visa")).await,
        ChargeAnswer::KeyCanceled
    );
    assert_eq!(sim.charges_created(), 0);
}

/// Charges and cancels race on many keys across threads: whichever registers first wins, and
/// the two answers always agree with each other and with the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_a_charge_is_atomic() {
    let sim = Arc::new(InMemoryCardProcessor::default());
    let mut races = Vec::new();
    for i in 0..200 {
        let key = format!("k{i}");
        let (charging, canceling) = (Arc::clone(&sim), Arc::clone(&sim));
        let charge_key = key.clone();
        let charge = async move { charging.submit(request(&charge_key, "tok_visa")).await };
        let cancel = async move { canceling.cancel_key::<ProcessorCharge>(&key) };
        // Either may be spawned first, so that each can win.
        let race = if i % 2 == 0 {
            let cancel = tokio::spawn(cancel);
            (tokio::spawn(charge), cancel)
        } else {
            (tokio::spawn(charge), tokio::spawn(cancel))
        };
        races.push(race);
    }

    let mut charged = 0;
    for (charge, cancel) in races {
        let charge = charge.await.unwrap_or_else(|e| panic!("{e}"));
        let cancel = cancel.await.unwrap_or_else(|e| panic!("{e}"));
        match (&charge, &cancel) {
            (ChargeAnswer::KeyCanceled, CancelOutcome::Canceled) => {}
            (ChargeAnswer::Settled(Outcome::Succeeded(_)), CancelOutcome::StillProcessing) => {
                charged += 1;
            }
            (ChargeAnswer::Settled(Outcome::Succeeded(made)), CancelOutcome::Exists(seen)) => {
                assert_eq!(made, seen);
                charged += 1;
            }
            other => panic!("inconsistent answers: {other:?}"),
        }
    }
    assert_eq!(sim.charges_created(), charged);
}
