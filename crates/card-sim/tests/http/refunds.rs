//! `POST /v1/refunds` and `refund` through `HttpCardProcessor`: exactly once per refund key,
//! never more than the charge took, and every refusal a 402 with its `decline_code`.

use std::sync::Arc;

use payments_domain::{CardProcessor, ProcessorError, ProcessorRefundStatus};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{
    REFUNDS, charge_body, refund_body, refund_request, spawn_sim, spawn_slow_sim, usd,
};

#[tokio::test]
async fn a_refund_and_its_repeat_under_the_same_key_return_one_refund() {
    let sim = spawn_sim().await;
    let (processor, charge) = sim.charged(usd(1999)).await;
    let request = refund_request("refund-1", &charge.id, usd(500));

    let first = processor.refund(request.clone()).await.expect("refund");
    let second = processor.refund(request).await.expect("repeated refund");

    assert_eq!(first, second);
    assert!(first.id.starts_with("re_"), "id {}", first.id);
    assert_eq!(first.processor_charge_id, charge.id);
    assert_eq!(first.money, usd(500));
    assert_eq!(first.status, ProcessorRefundStatus::Succeeded);
    assert_eq!(first.confirms(&charge.id, usd(500)), Ok(()));
    assert_eq!(sim.charges_created().await, 1);
    assert_eq!(sim.created(REFUNDS).await, 1);
}

/// Twenty refunds of a tenth of a 20.00 charge, under twenty keys, all in flight at once on a
/// slow processor: exactly ten fit.
#[tokio::test]
async fn concurrent_refunds_of_a_tenth_under_twenty_keys_refund_the_charge_exactly_once() {
    let sim = spawn_slow_sim().await;
    let (processor, charge) = sim.charged(usd(2000)).await;
    let processor = Arc::new(processor);

    let refunds: Vec<_> = (0..20)
        .map(|i| {
            let processor = Arc::clone(&processor);
            let request = refund_request(&format!("refund-{i}"), &charge.id, usd(200));
            tokio::spawn(async move { processor.refund(request).await })
        })
        .collect();
    let (mut refunded, mut too_large) = (0, 0);
    for refund in refunds {
        match refund.await.expect("join") {
            Ok(refund) => {
                assert_eq!(refund.money, usd(200));
                refunded += 1;
            }
            Err(ProcessorError::Declined { decline_code, .. })
                if decline_code == "amount_too_large" =>
            {
                too_large += 1;
            }
            other => panic!("unexpected answer: {other:?}"),
        }
    }

    assert_eq!((refunded, too_large), (10, 10));
    assert_eq!(sim.created(REFUNDS).await, 10);
}

#[tokio::test]
async fn tok_refund_declined_charges_but_its_refund_is_a_402_refund_declined_every_time() {
    let sim = spawn_sim().await;
    let (status, charge) = sim
        .post_charge(Some("order-1"), &charge_body("tok_refundDeclined"))
        .await;
    assert_eq!(status, StatusCode::OK, "{charge}");
    assert_eq!(charge["status"], "succeeded");

    let charge_id = charge["id"].as_str().expect("charge id");
    let body = refund_body(charge_id, 500);
    let (status, declined) = sim.create(REFUNDS, Some("refund-1"), &body).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{declined}");
    assert_eq!(declined["error"]["type"], "card_error");
    assert_eq!(declined["error"]["decline_code"], "refund_declined");
    assert!(declined["error"]["message"].is_string(), "{declined}");

    let repeated = sim.create(REFUNDS, Some("refund-1"), &body).await;
    assert_eq!(repeated, (StatusCode::PAYMENT_REQUIRED, declined));
    assert_eq!(sim.find(REFUNDS, "refund-1").await.0, StatusCode::NOT_FOUND);
    assert_eq!(sim.created(REFUNDS).await, 0);
    assert_eq!(sim.charges_created().await, 1);
}

#[tokio::test]
async fn each_refusal_is_a_402_with_its_decline_code_and_refunds_nothing() {
    let sim = spawn_sim().await;
    let (processor, charge) = sim.charged(usd(1999)).await;
    let refusals = [
        ("no_such_charge", refund_body("sim_unknown", 500)),
        ("amount_too_large", refund_body(&charge.id, 2000)),
        (
            "currency_mismatch",
            json!({"charge": charge.id, "amount": 500, "currency": "EUR"}),
        ),
    ];
    for (i, (decline_code, body)) in refusals.iter().enumerate() {
        let key = format!("refund-{i}");
        let (status, answer) = sim.create(REFUNDS, Some(&key), body).await;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body} -> {answer}");
        assert_eq!(answer["error"]["type"], "card_error", "{answer}");
        assert_eq!(answer["error"]["decline_code"], *decline_code, "{answer}");
    }

    let unknown = processor
        .refund(refund_request("refund-9", "sim_unknown", usd(500)))
        .await;
    assert!(
        matches!(&unknown, Err(ProcessorError::Declined { decline_code, .. }) if decline_code == "no_such_charge"),
        "{unknown:?}"
    );
    assert_eq!(sim.created(REFUNDS).await, 0);
}

#[tokio::test]
async fn a_refund_without_a_key_or_with_a_bad_body_is_a_json_400_and_refunds_nothing() {
    let sim = spawn_sim().await;
    let (_, charge) = sim.charged(usd(1999)).await;
    let keyless = sim
        .create(REFUNDS, None, &refund_body(&charge.id, 500))
        .await;
    assert_eq!(keyless.0, StatusCode::BAD_REQUEST, "{}", keyless.1);
    assert_eq!(keyless.1["error"]["type"], "invalid_request_error");

    let bad_bodies = [
        json!({"amount": 500, "currency": "USD"}),
        json!({"charge": "", "amount": 500, "currency": "USD"}),
        json!({"charge": charge.id, "amount": 0, "currency": "USD"}),
        json!({"charge": charge.id, "amount": "5", "currency": "USD"}),
        json!({"charge": charge.id, "amount": 500, "currency": "XXX"}),
    ];
    for (i, body) in bad_bodies.iter().enumerate() {
        let (status, answer) = sim.create(REFUNDS, Some(&format!("bad-{i}")), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{body}");
    }
    let no_query = sim.http().get(sim.url("/v1/refunds")).send().await;
    assert_eq!(no_query.expect("GET").status(), StatusCode::BAD_REQUEST);
    assert_eq!(sim.created(REFUNDS).await, 0);
}
