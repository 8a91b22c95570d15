//! The bodies as the service sends and takes them, byte for byte where it matters: a charge
//! request without `capture` is the request it always was, and a hold reads with its fields.

use serde_json::json;

use super::*;

fn charge_request(capture: Option<bool>) -> ChargeRequest {
    ChargeRequest {
        amount: 1999,
        currency: "usd".to_owned(),
        source: "tok_visa".to_owned(),
        description: None,
        capture,
    }
}

#[test]
fn a_charge_request_without_capture_is_byte_for_byte_what_it_was_before_holds() {
    let body = serde_json::to_string(&charge_request(None)).expect("JSON");
    assert_eq!(
        body,
        r#"{"amount":1999,"currency":"usd","source":"tok_visa"}"#
    );
    let hold = serde_json::to_string(&charge_request(Some(false))).expect("JSON");
    assert_eq!(
        hold,
        r#"{"amount":1999,"currency":"usd","source":"tok_visa","capture":false}"#
    );
}

fn body(request: &impl Serialize) -> String {
    serde_json::to_string(request).expect("JSON")
}

#[test]
fn a_capture_and_a_cancel_send_an_empty_object_unless_told_more() {
    assert_eq!(body(&CaptureRequest::default()), "{}");
    let part = CaptureRequest {
        amount_to_capture: Some(2000),
    };
    assert_eq!(body(&part), r#"{"amount_to_capture":2000}"#);
    assert_eq!(body(&CancelRequest::default()), "{}");
    let abandoned = CancelRequest {
        cancellation_reason: Some(CancellationReason::Abandoned),
    };
    assert_eq!(body(&abandoned), r#"{"cancellation_reason":"abandoned"}"#);
}

/// A charge's body as the service sends it, with `extra` fields.
fn charge_body(status: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut body = json!({
        "id": "ch_1", "object": "charge", "amount": 5000, "currency": "usd",
        "source": "tok_visa", "description": null, "status": status,
        "processor_charge_id": "sim_1", "created_at": "2026-12-01T12:00:00.000000Z",
        "amount_refunded": 0,
    });
    let (Some(fields), Some(extra)) = (body.as_object_mut(), extra.as_object()) else {
        panic!("objects");
    };
    fields.extend(extra.clone());
    body
}

#[test]
fn a_charge_captured_at_once_reads_and_writes_back_without_a_hold_s_fields() {
    let body = charge_body("succeeded", json!({}));
    let charge: Charge = serde_json::from_value(body.clone()).expect("a charge");
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    let hold_fields = (
        charge.captured,
        charge.amount_capturable,
        charge.amount_captured,
        charge.capture_before.as_deref(),
        charge.cancellation_reason,
    );
    assert_eq!(hold_fields, (None, None, None, None, None));
    assert_eq!(serde_json::to_value(&charge).expect("JSON"), body);
}

#[test]
fn a_hold_reads_with_its_fields_captured_or_canceled() {
    let held = charge_body(
        "requires_capture",
        json!({
            "captured": false, "amount_capturable": 5000, "amount_captured": 0,
            "capture_before": "2026-12-08T12:00:00.000000Z",
        }),
    );
    let charge: Charge = serde_json::from_value(held.clone()).expect("a hold");
    assert_eq!(charge.status, ChargeStatus::RequiresCapture);
    assert_eq!(
        (
            charge.captured,
            charge.amount_capturable,
            charge.amount_captured
        ),
        (Some(false), Some(5000), Some(0))
    );
    assert_eq!(
        charge.capture_before.as_deref(),
        Some("2026-12-08T12:00:00.000000Z")
    );
    assert_eq!(serde_json::to_value(&charge).expect("JSON"), held);

    let captured = charge_body(
        "succeeded",
        json!({
            "captured": true, "amount_capturable": 0, "amount_captured": 2000,
            "capture_before": "2026-12-08T12:00:00.000000Z",
        }),
    );
    let charge: Charge = serde_json::from_value(captured).expect("a captured hold");
    assert_eq!(
        (charge.status, charge.captured, charge.amount_captured),
        (ChargeStatus::Succeeded, Some(true), Some(2000))
    );

    for (reason, expected) in [
        ("abandoned", CanceledBecause::Abandoned),
        ("expired", CanceledBecause::Expired),
    ] {
        let canceled = charge_body(
            "canceled",
            json!({
                "captured": false, "amount_capturable": 0, "amount_captured": 0,
                "capture_before": "2026-12-08T12:00:00.000000Z",
                "cancellation_reason": reason,
            }),
        );
        let charge: Charge = serde_json::from_value(canceled).expect("a canceled hold");
        assert_eq!(charge.status, ChargeStatus::Canceled);
        assert_eq!(charge.cancellation_reason, Some(expected));
    }
    assert_eq!(
        CanceledBecause::from(CancellationReason::RequestedByCustomer),
        CanceledBecause::RequestedByCustomer
    );
    // A caller gives no `expired`: that is the service's own.
    let refused = serde_json::from_value::<CancellationReason>(json!("expired"));
    assert!(refused.is_err());
}

#[test]
fn a_balance_shows_what_holds_have_and_reads_without_it_from_an_older_service() {
    let older = json!({ "object": "balance", "available": [], "pending": [] });
    let balance: Balance = serde_json::from_value(older.clone()).expect("a balance");
    assert!(balance.authorized.is_empty());
    // None is left out, as the service leaves it out.
    assert_eq!(serde_json::to_value(&balance).expect("JSON"), older);
    let newer = json!({
        "object": "balance", "available": [], "pending": [],
        "authorized": [{ "amount": 5000, "currency": "usd" }],
    });
    let balance: Balance = serde_json::from_value(newer).expect("a balance");
    assert_eq!(
        balance.authorized,
        [BalanceAmount {
            amount: 5000,
            currency: "usd".to_owned()
        }]
    );
}

#[test]
fn a_key_s_operation_is_named_as_the_service_names_it() {
    let operations = [
        (KeyOperation::Charge, "charges.create"),
        (KeyOperation::Capture, "charges.capture"),
        (KeyOperation::Cancel, "charges.cancel"),
        (KeyOperation::Refund, "refunds.create"),
        (KeyOperation::Payout, "payouts.create"),
    ];
    for (operation, name) in operations {
        assert_eq!(operation.as_str(), name);
        assert_eq!(serde_json::to_value(operation).expect("JSON"), json!(name));
        let read: KeyOperation = serde_json::from_value(json!(name)).expect("a name");
        assert_eq!(read, operation);
    }
}
