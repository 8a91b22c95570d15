//! The settlement report: what came into existence on a day, in the order it did, with the
//! metadata its caller sent; and the differences a test can make between it and the books.

use chrono::NaiveDate;
use payments_domain::{
    Destination, ProcessorPayoutRequest, ProcessorRefundRequest, SettlementKind, SettlementLine,
    SettlementReport,
};

use super::*;

/// A long window: nothing in these tests is forgotten.
fn sim(clock: &ManualClock) -> InMemoryCardProcessor {
    clock.simulator(TimeDelta::days(7))
}

async fn charged(sim: &InMemoryCardProcessor, key: &str) -> ProcessorCharge {
    sim.charge(request(key, "tok_visa"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn refunded(sim: &InMemoryCardProcessor, key: &str, charge_id: &str) -> ProcessorRefund {
    let request = ProcessorRefundRequest {
        idempotency_key: key.into(),
        processor_charge_id: charge_id.into(),
        money: usd(40),
        metadata: metadata(&format!("re_{key}")),
    };
    sim.refund(request).await.unwrap_or_else(|e| panic!("{e}"))
}

async fn paid(sim: &InMemoryCardProcessor, key: &str) -> ProcessorPayout {
    let request = ProcessorPayoutRequest {
        idempotency_key: key.into(),
        money: usd(2500),
        destination: Destination::new("ba_checking").unwrap_or_else(|e| panic!("{e}")),
        metadata: metadata(&format!("po_{key}")),
    };
    sim.payout(request).await.unwrap_or_else(|e| panic!("{e}"))
}

fn line(
    kind: SettlementKind,
    id: &str,
    key: &str,
    money: Money,
    created_at: DateTime<Utc>,
    resource_id: &str,
) -> SettlementLine {
    SettlementLine {
        kind,
        processor_id: id.to_owned(),
        processor_key: key.to_owned(),
        money,
        status: ProcessorChargeStatus::Succeeded,
        created_at,
        metadata: Some(metadata(resource_id)),
    }
}

fn day(clock: &ManualClock) -> NaiveDate {
    clock.now().date_naive()
}

/// The report of `date`, read through the port.
async fn report(sim: &InMemoryCardProcessor, date: NaiveDate) -> Vec<SettlementLine> {
    sim.settlement_report(date)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn the_report_of_a_day_lists_what_was_made_that_day_in_the_order_it_was_made() {
    let clock = ManualClock::at(2025, 3, 13, 23);
    let sim = sim(&clock);
    let yesterday = charged(&sim, "before").await;
    let before = clock.now();

    clock.advance(TimeDelta::hours(1));
    let at = clock.now();
    // All within one tick of the clock, and not grouped by kind: only the order of creation
    // can put them in this order.
    let charge = charged(&sim, "k1").await;
    let payout = paid(&sim, "p1").await;
    let refund = refunded(&sim, "r1", &charge.id).await;
    // Nothing was made under these: no line.
    let declined = sim.charge(request("declined", "tok_chargeDeclined")).await;
    let failed = sim.charge(request("failed", "tok_processingError")).await;
    assert!(
        declined.is_err() && failed.is_err(),
        "{declined:?} {failed:?}"
    );
    assert_eq!(sim.cancel("canceled").await, Ok(CancelOutcome::Canceled));
    clock.advance(TimeDelta::minutes(30));
    let later = charged(&sim, "k2").await;
    let later_at = clock.now();

    clock.advance(TimeDelta::days(1));
    let tomorrow = charged(&sim, "after").await;

    assert_eq!(
        report(&sim, at.date_naive()).await,
        vec![
            line(
                SettlementKind::Charge,
                &charge.id,
                "k1",
                usd(100),
                at,
                "ch_k1"
            ),
            line(
                SettlementKind::Payout,
                &payout.id,
                "p1",
                usd(2500),
                at,
                "po_p1"
            ),
            line(
                SettlementKind::Refund,
                &refund.id,
                "r1",
                usd(40),
                at,
                "re_r1"
            ),
            line(
                SettlementKind::Charge,
                &later.id,
                "k2",
                usd(100),
                later_at,
                "ch_k2"
            ),
        ]
    );
    assert_ne!(before.date_naive(), at.date_naive());
    let yesterdays = report(&sim, before.date_naive()).await;
    let yesterday_line = line(
        SettlementKind::Charge,
        &yesterday.id,
        "before",
        usd(100),
        before,
        "ch_before",
    );
    assert_eq!(yesterdays, vec![yesterday_line]);
    let tomorrows = report(&sim, day(&clock)).await;
    assert_eq!(
        tomorrows
            .iter()
            .map(|l| &l.processor_id)
            .collect::<Vec<_>>(),
        vec![&tomorrow.id]
    );
}

#[tokio::test]
async fn a_dropped_line_leaves_every_report_but_the_charge_stays() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = sim(&clock);
    let dropped = charged(&sim, "dropped").await;
    let kept = charged(&sim, "kept").await;

    assert_eq!(sim.drop_from_report(&dropped.id), Ok(()));

    let ids: Vec<String> = report(&sim, day(&clock))
        .await
        .into_iter()
        .map(|line| line.processor_id)
        .collect();
    assert_eq!(ids, vec![kept.id]);
    // The books still have it: it is found, and refunded.
    assert_eq!(sim.find_charge("dropped").await, Ok(Some(dropped.clone())));
    let refund = refunded(&sim, "r", &dropped.id).await;
    assert_eq!(refund.processor_charge_id, dropped.id);
}

#[tokio::test]
async fn an_altered_line_shows_the_new_amount_and_the_books_keep_theirs() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = sim(&clock);
    let charge = charged(&sim, "k").await;
    let amount = Amount::new(99).unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(sim.alter_in_report(&charge.id, amount), Ok(()));

    let lines = report(&sim, day(&clock)).await;
    let moneys: Vec<Money> = lines.iter().map(|line| line.money).collect();
    assert_eq!(moneys, vec![usd(99)]);
    assert_eq!(sim.find_charge("k").await, Ok(Some(charge)));
}

#[tokio::test]
async fn only_what_is_remembered_can_be_dropped_or_altered() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = sim(&clock);
    let declined = sim.charge(request("k", "tok_chargeDeclined")).await;
    assert!(declined.is_err());
    let unknown = UnknownProcessorId {
        processor_id: "sim_nope".into(),
    };
    assert_eq!(sim.drop_from_report("sim_nope"), Err(unknown.clone()));
    assert_eq!(sim.alter_in_report("sim_nope", usd(1).amount), Err(unknown));
    assert_eq!(report(&sim, day(&clock)).await, vec![]);
}

#[tokio::test]
async fn an_unsolicited_charge_is_reported_and_answers_its_key_like_any_other() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = sim(&clock);
    let someone = ProcessorMetadata::new(TenantId::new("acme"), "ch_someone_else");

    let charge = sim
        .charge_unsolicited("theirs", usd(777), Some(someone.clone()))
        .unwrap_or_else(|e| panic!("{e}"));
    let anonymous = sim
        .charge_unsolicited("anonymous", usd(5), None)
        .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(charge.money, usd(777));
    assert_eq!(charge.status, ProcessorChargeStatus::Succeeded);
    let mut expected = line(
        SettlementKind::Charge,
        &charge.id,
        "theirs",
        usd(777),
        clock.now(),
        "ch_someone_else",
    );
    expected.metadata = Some(someone);
    let mut anonymous_line = line(
        SettlementKind::Charge,
        &anonymous.id,
        "anonymous",
        usd(5),
        clock.now(),
        "",
    );
    anonymous_line.metadata = None;
    assert_eq!(
        report(&sim, day(&clock)).await,
        vec![expected, anonymous_line]
    );
    // Its key answers as any charge's: a lookup, a cancel, a repeat, a refund.
    assert_eq!(sim.find_charge("theirs").await, Ok(Some(charge.clone())));
    assert_eq!(
        sim.cancel("theirs").await,
        Ok(CancelOutcome::Exists(charge.clone()))
    );
    let repeat = sim.charge_unsolicited("theirs", usd(1), None);
    assert_eq!(repeat, Ok(charge.clone()));
    assert_eq!(refunded(&sim, "r", &charge.id).await.money, usd(40));
    assert_eq!(sim.charges_created(), 2);
}

#[tokio::test]
async fn an_unsolicited_charge_under_a_canceled_key_is_refused() {
    let clock = ManualClock::at(2025, 3, 14, 10);
    let sim = sim(&clock);
    assert_eq!(sim.cancel("k").await, Ok(CancelOutcome::Canceled));
    let refused = sim.charge_unsolicited("k", usd(5), None);
    assert!(is_unavailable(&refused), "{refused:?}");
    assert_eq!(sim.charges_created(), 0);
}
