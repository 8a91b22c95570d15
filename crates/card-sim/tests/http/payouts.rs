//! `POST /v1/payouts` and `payout` through `HttpCardProcessor`: exactly once per payout key, a
//! closed account a 402 `account_closed` every time, and no card number taken for an account.

use payments_domain::{PayoutProcessor, ProcessorError, ProcessorPayoutStatus};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{PATIENT, PAYOUTS, payout_body, payout_request, spawn_sim, usd};

#[tokio::test]
async fn a_payout_and_its_repeat_under_the_same_key_return_one_payout() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);
    let request = payout_request("payout-1", "ba_checking", usd(2500));

    let first = processor.payout(request.clone()).await.expect("payout");
    let second = processor
        .payout(request.clone())
        .await
        .expect("repeated payout");

    assert_eq!(first, second);
    assert!(first.id.starts_with("po_"), "id {}", first.id);
    assert_eq!(first.destination, "ba_checking");
    assert_eq!(first.money, usd(2500));
    assert_eq!(first.status, ProcessorPayoutStatus::Succeeded);
    assert_eq!(first.confirms(&request.destination, usd(2500)), Ok(()));
    assert_eq!(processor.find_payout("payout-1").await, Ok(Some(first)));
    assert_eq!(sim.created(PAYOUTS).await, 1);
    assert_eq!(sim.charges_created().await, 0);
}

#[tokio::test]
async fn a_payout_to_ba_declined_is_a_402_account_closed_every_time_and_pays_nothing() {
    let sim = spawn_sim().await;
    let body = payout_body("ba_declined", 500);
    for _ in 0..2 {
        let (status, declined) = sim.create(PAYOUTS, Some("payout-1"), &body).await;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{declined}");
        assert_eq!(declined["error"]["type"], "card_error", "{declined}");
        assert_eq!(
            declined["error"]["decline_code"], "account_closed",
            "{declined}"
        );
    }
    let through_client = sim
        .processor(PATIENT)
        .payout(payout_request("payout-2", "ba_declined", usd(500)))
        .await;
    assert!(
        matches!(&through_client, Err(ProcessorError::Declined { decline_code, .. }) if decline_code == "account_closed"),
        "{through_client:?}"
    );
    assert_eq!(sim.find(PAYOUTS, "payout-1").await.0, StatusCode::NOT_FOUND);
    assert_eq!(sim.created(PAYOUTS).await, 0);
}

#[tokio::test]
async fn a_payout_without_a_key_or_with_a_bad_body_is_a_json_400_and_pays_nothing() {
    let sim = spawn_sim().await;
    let keyless = sim
        .create(PAYOUTS, None, &payout_body("ba_checking", 500))
        .await;
    assert_eq!(keyless.0, StatusCode::BAD_REQUEST, "{}", keyless.1);
    assert_eq!(keyless.1["error"]["type"], "invalid_request_error");

    let bad_bodies = [
        json!({"amount": 500, "currency": "USD"}),
        json!({"amount": 500, "currency": "USD", "destination": "tok_visa"}),
        json!({"amount": 500, "currency": "USD", "destination": "ba_4242424242424242"}),
        json!({"amount": 0, "currency": "USD", "destination": "ba_checking"}),
        json!({"amount": 500, "currency": "XXX", "destination": "ba_checking"}),
    ];
    for (i, body) in bad_bodies.iter().enumerate() {
        let (status, answer) = sim.create(PAYOUTS, Some(&format!("bad-{i}")), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{body}");
    }
    let card_number = sim
        .create(PAYOUTS, Some("bad-card"), &bad_bodies[2])
        .await
        .1;
    let message = card_number["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("card number"), "{card_number}");
    assert!(!message.contains("4242424242424242"), "{card_number}");
    assert_eq!(sim.created(PAYOUTS).await, 0);
}
