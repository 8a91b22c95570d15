//! Authorise, capture and void over real HTTP: `"capture": false` on `POST /v1/charges`,
//! `POST /v1/captures` and `POST /v1/voids`, through `HttpCardProcessor` and raw, each refusal a
//! 402 with its `decline_code`, and `GET /v1/stats` counting each kind exactly.

use std::time::{Duration, Instant};

use payments_card_sim::TestToken;
use payments_domain::{
    CancelOutcome, CaptureMethod, CardProcessor, ProcessorChargeStatus, ProcessorError, decline,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    CAPTURES, CHARGES, PATIENT, REFUNDS, VOIDS, capture_body, capture_request, charge_body,
    refund_body, refund_request, request, spawn_sim, spawn_slow_sim, usd, void_body, void_request,
};

/// The `decline_code` of a declined call, `None` for any other result.
fn decline_code<T>(result: &Result<T, ProcessorError>) -> Option<&str> {
    match result {
        Err(ProcessorError::Declined { decline_code, .. }) => Some(decline_code.as_str()),
        _ => None,
    }
}

/// Two authorisations through the client: one captured in part, one voided; every call the
/// state forbids is declined with its code, and the counts say exactly what was made.
#[tokio::test]
async fn authorise_capture_and_void_through_the_client_and_the_counts_report_each() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);
    let captured = processor.authorize(request("auth-1", "tok_visa")).await;
    let voided = processor.authorize(request("auth-2", "tok_visa")).await;
    let (captured, voided) = (captured.expect("authorize"), voided.expect("authorize"));
    assert_eq!(captured.status, ProcessorChargeStatus::RequiresCapture);
    assert_eq!(
        captured.confirms_as(CaptureMethod::Manual, usd(1999)),
        Ok(())
    );

    let capture = processor
        .capture(capture_request("cap-1", &captured.id, usd(1500)))
        .await
        .expect("capture");
    assert!(capture.id.starts_with("cap_"), "{}", capture.id);
    assert_eq!(capture.confirms(&captured.id, usd(1500)), Ok(()));
    let repeated = processor
        .capture(capture_request("cap-1", &captured.id, usd(1500)))
        .await;
    assert_eq!(repeated, Ok(capture.clone()));
    let void = processor
        .void(void_request("void-1", &voided.id))
        .await
        .expect("void");
    assert!(void.id.starts_with("void_"), "{}", void.id);
    assert_eq!(void.confirms(&voided.id, voided.money), Ok(()));

    let refused = [
        (
            processor
                .capture(capture_request("cap-2", &captured.id, usd(1)))
                .await
                .map(drop),
            decline::ALREADY_CAPTURED,
        ),
        (
            processor
                .void(void_request("void-2", &captured.id))
                .await
                .map(drop),
            decline::ALREADY_CAPTURED,
        ),
        (
            processor
                .capture(capture_request("cap-3", &voided.id, usd(1)))
                .await
                .map(drop),
            decline::CANCELED,
        ),
        (
            processor
                .refund(refund_request("re-1", &voided.id, usd(1)))
                .await
                .map(drop),
            "charge_not_captured",
        ),
        (
            processor
                .refund(refund_request("re-2", &captured.id, usd(1501)))
                .await
                .map(drop),
            "amount_too_large",
        ),
    ];
    for (i, (result, code)) in refused.iter().enumerate() {
        assert_eq!(decline_code(result), Some(*code), "{i}: {result:?}");
    }
    let refund = processor
        .refund(refund_request("re-3", &captured.id, usd(1500)))
        .await;
    assert!(refund.is_ok(), "{refund:?}");

    assert_eq!(
        processor.cancel_capture("cap-1").await,
        Ok(CancelOutcome::Exists(capture))
    );
    assert_eq!(
        processor.cancel_void("void-1").await,
        Ok(CancelOutcome::Exists(void))
    );
    assert_eq!(
        sim.stats().await,
        json!({
            "charges_created": 2,
            "authorizations_created": 2,
            "captures_created": 1,
            "voids_created": 1,
            "refunds_created": 1,
            "payouts_created": 0,
        })
    );
}

#[tokio::test]
async fn cancel_capture_and_cancel_void_of_unknown_keys_tombstone_them_through_the_client() {
    let sim = spawn_sim().await;
    let (processor, authorization) = sim.authorized(usd(1999)).await;
    assert_eq!(
        processor.cancel_capture("never").await,
        Ok(CancelOutcome::Canceled)
    );
    assert_eq!(
        processor.cancel_void("never").await,
        Ok(CancelOutcome::Canceled)
    );
    let canceled = ProcessorError::Unavailable {
        reason: "processor answered 409 idempotency_key_canceled".into(),
    };
    let capture = processor
        .capture(capture_request("never", &authorization.id, usd(1999)))
        .await;
    let void = processor
        .void(void_request("never", &authorization.id))
        .await;
    assert_eq!(capture.map(drop), Err(canceled.clone()));
    assert_eq!(void.map(drop), Err(canceled));
    assert_eq!(sim.created(CAPTURES).await, 0);
    assert_eq!(sim.created(VOIDS).await, 0);
}

/// `"capture": false` authorises; absent or `true`, the charge is captured when it is made,
/// as it always was. Every refusal is a 402 `card_error` with its `decline_code`.
#[tokio::test]
async fn over_raw_http_capture_false_authorises_and_each_refusal_has_its_decline_code() {
    let sim = spawn_sim().await;
    let mut authorization = charge_body("tok_visa");
    authorization["capture"] = json!(false);
    let mut captured_at_once = charge_body("tok_visa");
    captured_at_once["capture"] = json!(true);
    let (_, held) = sim.post_charge(Some("held"), &authorization).await;
    let (_, charged) = sim
        .post_charge(Some("charged"), &charge_body("tok_visa"))
        .await;
    let (_, charged_too) = sim
        .post_charge(Some("charged-too"), &captured_at_once)
        .await;
    assert_eq!(held["status"], "requires_capture", "{held}");
    assert_eq!(charged["status"], "succeeded", "{charged}");
    assert_eq!(charged_too["status"], "succeeded", "{charged_too}");
    let (held, charged) = (id(&held), id(&charged));

    let refusals = [
        (
            CAPTURES,
            capture_body(&held, 2000),
            decline::AMOUNT_TOO_LARGE,
        ),
        (
            CAPTURES,
            json!({"charge": held, "amount": 500, "currency": "EUR"}),
            decline::NOT_CAPTURABLE,
        ),
        (
            CAPTURES,
            capture_body(&charged, 500),
            decline::NOT_CAPTURABLE,
        ),
        (VOIDS, void_body(&charged), decline::NOT_CAPTURABLE),
        (VOIDS, void_body("sim_unknown"), decline::NOT_CAPTURABLE),
        (REFUNDS, refund_body(&held, 500), "charge_not_captured"),
    ];
    for (i, (kind, body, decline_code)) in refusals.iter().enumerate() {
        let (status, answer) = sim.create(*kind, Some(&format!("no-{i}")), body).await;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{body} -> {answer}");
        assert_eq!(answer["error"]["type"], "card_error", "{answer}");
        assert_eq!(answer["error"]["decline_code"], *decline_code, "{answer}");
    }

    let (status, capture) = sim
        .create(CAPTURES, Some("cap"), &capture_body(&held, 500))
        .await;
    assert_eq!(status, StatusCode::OK, "{capture}");
    assert_eq!(capture["object"], "capture");
    assert_eq!(capture["charge"], held.as_str());
    assert_eq!(
        (&capture["amount"], &capture["currency"]),
        (&json!(500), &json!("USD"))
    );
    assert_eq!(sim.find(CAPTURES, "cap").await, (StatusCode::OK, capture));
    let (status, void) = sim.create(VOIDS, Some("void"), &void_body(&held)).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{void}");
    assert_eq!(void["error"]["decline_code"], decline::ALREADY_CAPTURED);
    assert_eq!(sim.find(VOIDS, "void").await.0, StatusCode::NOT_FOUND);

    assert_eq!(sim.charges_created().await, 3);
    assert_eq!(sim.authorizations_created().await, 1);
    assert_eq!(sim.created(CAPTURES).await, 1);
    assert_eq!(sim.created(VOIDS).await, 0);
    assert_eq!(sim.created(REFUNDS).await, 0);
}

#[tokio::test]
async fn a_capture_or_void_without_a_key_or_with_a_bad_body_is_a_json_400_and_makes_nothing() {
    let sim = spawn_sim().await;
    let (_, authorization) = sim.authorized(usd(1999)).await;
    let keyless = sim
        .create(CAPTURES, None, &capture_body(&authorization.id, 500))
        .await;
    assert_eq!(keyless.0, StatusCode::BAD_REQUEST, "{}", keyless.1);
    let keyless = sim.create(VOIDS, None, &void_body(&authorization.id)).await;
    assert_eq!(keyless.0, StatusCode::BAD_REQUEST, "{}", keyless.1);

    let bad = [
        (CAPTURES, json!({"amount": 500, "currency": "USD"})),
        (CAPTURES, capture_body("", 500)),
        (CAPTURES, capture_body(&authorization.id, 0)),
        (
            CAPTURES,
            json!({"charge": authorization.id, "amount": 5, "currency": "XXX"}),
        ),
        (VOIDS, json!({})),
        (VOIDS, void_body("")),
    ];
    for (i, (kind, body)) in bad.iter().enumerate() {
        let (status, answer) = sim.create(*kind, Some(&format!("bad-{i}")), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{body}");
    }
    assert_eq!(sim.created(CAPTURES).await, 0);
    assert_eq!(sim.created(VOIDS).await, 0);
}

/// A capture and a void of one authorisation, both in flight at once on a slow processor:
/// exactly one of them succeeds.
#[tokio::test]
async fn a_capture_and_a_void_racing_over_http_exactly_one_succeeds() {
    let sim = spawn_slow_sim().await;
    let (processor, authorization) = sim.authorized(usd(1999)).await;
    let (capture, void) = tokio::join!(
        processor.capture(capture_request("cap", &authorization.id, usd(1999))),
        processor.void(void_request("void", &authorization.id)),
    );
    match (decline_code(&capture), decline_code(&void)) {
        (None, Some(decline::ALREADY_CAPTURED)) if capture.is_ok() => {}
        (Some(decline::CANCELED), None) if void.is_ok() => {}
        _ => panic!("inconsistent answers: {capture:?} {void:?}"),
    }
    let made = sim.created(CAPTURES).await + sim.created(VOIDS).await;
    assert_eq!(made, 1);
}

/// A `tok_slow` authorisation's capture is slow too: a client that gives up gets no answer,
/// the capture is still processing under its key, a void begun meanwhile is already declined,
/// and the capture comes into existence once its latency has passed.
#[tokio::test]
async fn a_slow_authorisations_capture_is_slow_and_a_client_that_times_out_finds_it_later() {
    let sim = spawn_sim().await;
    let patient = sim.processor(PATIENT);
    let authorization = patient
        .authorize(request("auth-slow", "tok_slow"))
        .await
        .expect("authorize");
    let impatient = sim.processor(Duration::from_millis(300));
    let capture = capture_request("cap", &authorization.id, usd(1999));
    let began = Instant::now();

    let timed_out = impatient.capture(capture.clone()).await;
    assert_eq!(
        timed_out,
        Err(ProcessorError::Unavailable {
            reason: "no answer within 300 ms; the outcome is unknown".into()
        })
    );
    assert_eq!(
        patient.cancel_capture("cap").await,
        Ok(CancelOutcome::StillProcessing)
    );
    let void = patient.void(void_request("void", &authorization.id)).await;
    assert_eq!(decline_code(&void), Some(decline::ALREADY_CAPTURED));

    let found = loop {
        let (status, found) = sim.find(CAPTURES, "cap").await;
        if status == StatusCode::OK {
            break found;
        }
        assert!(
            began.elapsed() < 2 * TestToken::SLOW_LATENCY,
            "no capture yet"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        began.elapsed() >= TestToken::SLOW_LATENCY,
        "{:?}",
        began.elapsed()
    );
    let capture = patient.capture(capture).await.expect("the capture");
    assert_eq!(found["id"], capture.id.as_str());
    assert_eq!(sim.created(CAPTURES).await, 1);
    assert_eq!(sim.created(VOIDS).await, 0);
    assert_eq!(sim.created(CHARGES).await, 1);
}

fn id(view: &Value) -> String {
    view["id"].as_str().expect("an id").to_owned()
}
