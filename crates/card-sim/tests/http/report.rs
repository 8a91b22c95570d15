//! `GET /v1/reports/settlement` and the `/v1/testing/` differences: the CSV as served, the same
//! report read through `HttpCardProcessor`, metadata that could break a CSV, and lines
//! dropped, altered or made by someone else.
//!
//! A test that ran across midnight UTC would find its lines on two days, so the reports are
//! read from the day the test began through today.

use axum::http::StatusCode;
use chrono::{DateTime, NaiveDate, Utc};
use payments_card_sim::HttpCardProcessor;
use payments_domain::{
    CancelOutcome, CardProcessor, PayoutProcessor, ProcessorChargeRequest, ProcessorChargeStatus,
    ProcessorMetadata, SettlementKind, SettlementLine, SettlementReport, TenantId,
};
use serde_json::{Value, json};

use crate::helpers::{PATIENT, TestSim, payout_request, refund_request, request, spawn_sim, usd};

const HEADER: &str =
    "type,processor_id,processor_key,amount,currency,status,created_at,tenant,resource_id";

fn today() -> NaiveDate {
    Utc::now().date_naive()
}

/// Every day from `since` through today, as `YYYY-MM-DD`.
fn days_since(since: NaiveDate) -> Vec<String> {
    since
        .iter_days()
        .take_while(|day| *day <= today())
        .map(|day| day.format("%Y-%m-%d").to_string())
        .collect()
}

/// The records of the served reports from `since` through today, without their headers,
/// after checking that each report is CSV that starts with the header and ends its records
/// with CRLF.
async fn served_records(sim: &TestSim, since: NaiveDate) -> Vec<String> {
    let mut records = Vec::new();
    for day in days_since(since) {
        let (status, content_type, body) = sim.settlement_report(&[("date", &day)]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(content_type.starts_with("text/csv"), "{content_type}");
        let body = body
            .strip_suffix("\r\n")
            .unwrap_or_else(|| panic!("{body:?} does not end with CRLF"));
        let mut lines = body.split("\r\n");
        assert_eq!(lines.next(), Some(HEADER));
        records.extend(lines.map(str::to_owned));
    }
    records
}

/// The lines `processor` reads from `since` through today.
async fn reported_since(processor: &HttpCardProcessor, since: NaiveDate) -> Vec<SettlementLine> {
    let mut lines = Vec::new();
    for day in days_since(since) {
        let day = day.parse().expect("a date");
        let report = processor.settlement_report(day).await;
        lines.extend(report.unwrap_or_else(|e| panic!("report of {day}: {e}")));
    }
    lines
}

/// The one line under `key`.
fn line_of<'a>(lines: &'a [SettlementLine], key: &str) -> &'a SettlementLine {
    let mut found = lines.iter().filter(|line| line.processor_key == key);
    let line = found
        .next()
        .unwrap_or_else(|| panic!("no line under {key}: {lines:?}"));
    assert!(found.next().is_none(), "two lines under {key}: {lines:?}");
    line
}

#[tokio::test]
async fn the_report_is_csv_with_a_line_per_charge_refund_and_payout_in_order() {
    let sim = spawn_sim().await;
    let since = today();
    let processor = sim.processor(PATIENT);
    let charge = processor.charge(request("order-1", "tok_visa")).await;
    let charge = charge.expect("charge");
    let refund = processor
        .refund(refund_request("refund-1", &charge.id, usd(500)))
        .await
        .expect("refund");
    let payout = processor
        .payout(payout_request("payout-1", "ba_checking", usd(700)))
        .await
        .expect("payout");
    let declined = processor
        .charge(request("declined", "tok_chargeDeclined"))
        .await;
    assert!(declined.is_err(), "{declined:?}");

    let records = served_records(&sim, since).await;
    let fields: Vec<Vec<&str>> = records.iter().map(|r| r.split(',').collect()).collect();
    let expected: [[&str; 8]; 3] = [
        [
            "charge",
            &charge.id,
            "order-1",
            "1999",
            "USD",
            "succeeded",
            "acme",
            "ch_order-1",
        ],
        [
            "refund",
            &refund.id,
            "refund-1",
            "500",
            "USD",
            "succeeded",
            "acme",
            "re_refund-1",
        ],
        [
            "payout",
            &payout.id,
            "payout-1",
            "700",
            "USD",
            "succeeded",
            "acme",
            "po_payout-1",
        ],
    ];
    assert_eq!(fields.len(), expected.len(), "{records:?}");
    for (fields, expected) in fields.iter().zip(expected) {
        assert_eq!(fields.len(), 9, "{fields:?}");
        let (created_at, rest) = (fields[6], [&fields[..6], &fields[7..]].concat());
        assert_eq!(rest, expected);
        let created_at = DateTime::parse_from_rfc3339(created_at).expect("RFC 3339");
        assert!(created_at.date_naive() >= since, "{created_at}");
        assert!(fields[6].ends_with('Z'), "{}: not UTC", fields[6]);
    }
}

#[tokio::test]
async fn a_missing_or_malformed_date_is_a_400_with_the_usual_json_error() {
    let sim = spawn_sim().await;
    let queries: [&[(&str, &str)]; 5] = [
        &[],
        &[("date", "")],
        &[("date", "2025-13-01")],
        &[("date", "2025-3-4")],
        &[("date", "yesterday")],
    ];
    for query in queries {
        let (status, content_type, body) = sim.settlement_report(query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query:?}");
        assert!(
            content_type.starts_with("application/json"),
            "{content_type}"
        );
        let body: Value = serde_json::from_str(&body).expect("JSON error");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
}

/// Metadata is client text: a comma, a quote and a newline in it must come back as sent, and
/// every other line must still read.
#[tokio::test]
async fn metadata_round_trips_through_the_http_client_even_with_a_comma_a_quote_and_a_newline() {
    let sim = spawn_sim().await;
    let since = today();
    let processor = sim.processor(PATIENT);
    let hostile = ProcessorMetadata::new(
        TenantId::new("acme, \"the\" company\nline two"),
        "ch_1,\"x\"\r\ny",
    );
    let charge = processor
        .charge(ProcessorChargeRequest {
            metadata: hostile.clone(),
            ..request("hostile", "tok_visa")
        })
        .await
        .expect("charge");
    let refund = processor
        .refund(refund_request("refund", &charge.id, usd(100)))
        .await
        .expect("refund");

    let lines = reported_since(&processor, since).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    let line = line_of(&lines, "hostile");
    assert_eq!(line.kind, SettlementKind::Charge);
    assert_eq!(line.processor_id, charge.id);
    assert_eq!(line.money, usd(1999));
    assert_eq!(line.status, ProcessorChargeStatus::Succeeded);
    assert_eq!(line.metadata.as_ref(), Some(&hostile));
    let refund_line = line_of(&lines, "refund");
    assert_eq!(refund_line.processor_id, refund.id);
    assert_eq!(
        refund_line.metadata,
        Some(ProcessorMetadata::new(TenantId::new("acme"), "re_refund"))
    );

    // The views show the metadata as sent, and when it was created.
    let (status, view) = sim.find(crate::helpers::CHARGES, "hostile").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        view["metadata"],
        json!({"tenant": "acme, \"the\" company\nline two", "resource_id": "ch_1,\"x\"\r\ny"})
    );
    let created = view["created"].as_i64().expect("created");
    assert_eq!(Some(created), Some(line.created_at.timestamp()));
}

#[tokio::test]
async fn a_dropped_line_leaves_every_report_but_the_charge_stays() {
    let sim = spawn_sim().await;
    let since = today();
    let processor = sim.processor(PATIENT);
    let dropped = processor.charge(request("dropped", "tok_visa")).await;
    let dropped = dropped.expect("charge");
    let kept = processor.charge(request("kept", "tok_visa")).await;
    let kept = kept.expect("charge");

    let answer = sim
        .testing("report/drop", &json!({"processor_id": dropped.id}))
        .await;
    assert_eq!(answer, (StatusCode::NO_CONTENT, Value::Null));

    let lines = reported_since(&processor, since).await;
    let ids: Vec<&str> = lines.iter().map(|l| l.processor_id.as_str()).collect();
    assert_eq!(ids, vec![kept.id.as_str()]);
    assert_eq!(processor.find_charge("dropped").await, Ok(Some(dropped)));
}

#[tokio::test]
async fn an_altered_line_shows_the_new_amount() {
    let sim = spawn_sim().await;
    let since = today();
    let processor = sim.processor(PATIENT);
    let charge = processor.charge(request("k", "tok_visa")).await;
    let charge = charge.expect("charge");

    let body = json!({"processor_id": charge.id, "amount": 42});
    let answer = sim.testing("report/alter", &body).await;
    assert_eq!(answer, (StatusCode::NO_CONTENT, Value::Null));

    let lines = reported_since(&processor, since).await;
    assert_eq!(line_of(&lines, "k").money, usd(42));
    assert_eq!(processor.find_charge("k").await, Ok(Some(charge)));
}

#[tokio::test]
async fn an_unknown_processor_id_is_a_404_and_a_bad_amount_a_400() {
    let sim = spawn_sim().await;
    let cases = [
        (
            "report/drop",
            json!({"processor_id": "sim_nope"}),
            StatusCode::NOT_FOUND,
        ),
        (
            "report/alter",
            json!({"processor_id": "sim_nope", "amount": 42}),
            StatusCode::NOT_FOUND,
        ),
        (
            "report/alter",
            json!({"processor_id": "sim_nope", "amount": 0}),
            StatusCode::BAD_REQUEST,
        ),
        ("report/drop", json!({}), StatusCode::BAD_REQUEST),
    ];
    for (path, body, expected) in cases {
        let (status, error) = sim.testing(path, &body).await;
        assert_eq!(status, expected, "{path} {body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    }
}

#[tokio::test]
async fn an_unsolicited_charge_is_reported_and_answers_its_key_like_any_other() {
    let sim = spawn_sim().await;
    let since = today();
    let processor = sim.processor(PATIENT);
    let body = json!({
        "processor_key": "theirs",
        "amount": 777,
        "currency": "usd",
        "tenant": "globex",
        "resource_id": "ch_never_asked",
    });

    let (status, view) = sim.testing("charges/unsolicited", &body).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["amount"], 777);
    assert_eq!(view["status"], "succeeded");
    assert_eq!(
        view["metadata"],
        json!({"tenant": "globex", "resource_id": "ch_never_asked"})
    );
    let id = view["id"].as_str().expect("an id").to_owned();

    let lines = reported_since(&processor, since).await;
    let line = line_of(&lines, "theirs");
    assert_eq!(line.processor_id, id);
    assert_eq!(line.money, usd(777));
    assert_eq!(
        line.metadata,
        Some(ProcessorMetadata::new(
            TenantId::new("globex"),
            "ch_never_asked"
        ))
    );
    let found = processor.find_charge("theirs").await.expect("lookup");
    assert_eq!(found.map(|charge| charge.id), Some(id.clone()));
    let canceled = processor.cancel("theirs").await.expect("cancel");
    assert!(
        matches!(&canceled, CancelOutcome::Exists(charge) if charge.id == id),
        "{canceled:?}"
    );
    assert_eq!(sim.charges_created().await, 1);
}
