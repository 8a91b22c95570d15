//! `GET /events`: a consumer that missed the stream reads the tenant's events from the outbox,
//! oldest first, in pages that neither skip nor repeat an event while others are written.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::{Value, json};

use crate::helpers::{
    ACME, Backend, GLOBEX, TestApp, new_key, payout, problem, spawn_app, spawn_app_with, visa,
};

/// Every event the tenant can read now, from after `cursor`, in pages of `limit`.
async fn read_from(app: &TestApp, api_key: &str, cursor: Option<&str>, limit: u32) -> Vec<Value> {
    let mut events = Vec::new();
    let mut cursor = cursor.map(str::to_owned);
    loop {
        let path = match &cursor {
            Some(id) => format!("/events?limit={limit}&starting_after={id}"),
            None => format!("/events?limit={limit}"),
        };
        let page = app.get_json(api_key, &path).await;
        let data = page["data"].as_array().expect("data").clone();
        cursor = data
            .last()
            .map(|e| e["id"].as_str().expect("id").to_owned())
            .or(cursor);
        events.extend(data);
        if page["has_more"] != json!(true) {
            return events;
        }
    }
}

/// Every event of the tenant once the feed shows `count`: on PostgreSQL an event is shown only
/// once every transaction older than its writer has ended, on the whole server, and other
/// tests' transactions can delay that a moment.
async fn read_all(app: &TestApp, api_key: &str, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = read_from(app, api_key, None, 2).await;
        if events.len() >= count || Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What an event is about: its type and the charge, refund or payout it reports.
fn subject(event: &Value) -> (String, String) {
    let payload = &event["payload"];
    let id = ["refund_id", "payout_id", "charge_id"]
        .iter()
        .find_map(|field| payload[field].as_str())
        .expect("a subject id");
    (
        event["type"].as_str().expect("type").to_owned(),
        id.to_owned(),
    )
}

async fn created(response: reqwest::Response) -> String {
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.expect("JSON");
    body["id"].as_str().expect("id").to_owned()
}

async fn every_event_of_the_tenant_is_listed_in_order_and_none_of_another(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut expected = Vec::new();
    for amount in [500, 700] {
        let charge = created(app.post_charge(ACME, &new_key(), &visa(amount)).await).await;
        expected.push(("payment.completed".to_owned(), charge));
        created(app.post_charge(GLOBEX, &new_key(), &visa(amount)).await).await;
    }
    let refund = created(
        app.post_refund(ACME, &expected[0].1, &new_key(), &json!({ "amount": 100 }))
            .await,
    )
    .await;
    expected.push(("payment.refunded".to_owned(), refund));
    let paid = created(app.post_payout(ACME, &new_key(), &payout(300)).await).await;
    expected.push(("payout.paid".to_owned(), paid));
    let charge = created(app.post_charge(ACME, &new_key(), &visa(900)).await).await;
    expected.push(("payment.completed".to_owned(), charge));

    let events = read_all(&app, ACME, expected.len()).await;
    let subjects: Vec<_> = events.iter().map(subject).collect();
    assert_eq!(
        subjects, expected,
        "every event of the tenant, in the order written"
    );
    for event in &events {
        assert_eq!(event["object"], "event");
        assert_eq!(event["payload"]["tenant"], "acme");
        let event_id = event["event_id"].as_str().expect("event_id");
        assert_eq!(
            event["payload"]["event_id"], event_id,
            "the stream's event id"
        );
        assert_eq!(event["id"], format!("evt_{event_id}"));
        let id = event["id"].as_str().expect("id");
        assert_eq!(&app.get_json(ACME, &format!("/events/{id}")).await, event);
    }

    let theirs = read_all(&app, GLOBEX, 2).await;
    assert_eq!(theirs.len(), 2);
    assert!(theirs.iter().all(|e| e["payload"]["tenant"] == "globex"));
    let ours = events[0]["id"].as_str().expect("id");
    let (status, body) = problem(app.get(GLOBEX, &format!("/events/{ours}")).await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let path = format!("/events?starting_after={ours}");
    let (status, body) = problem(app.get(GLOBEX, &path).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );

    let refunds = app.get_json(ACME, "/events?type=payment.refunded").await;
    let refunds: Vec<_> = refunds["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(subject)
        .collect();
    assert_eq!(refunds, [expected[2].clone()]);
    let (status, body) = problem(app.get(ACME, "/events?type=charge.created").await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    for bad in ["/events?limit=0", "/events?limit=101", "/events?cursor=x"] {
        let (status, body) = problem(app.get(ACME, bad).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}"
        );
    }
}

/// A reader that follows the feed while 60 charges are made 6 at a time ends up with exactly
/// the feed a reader sees afterwards from the start: no event skipped, none twice.
async fn pages_neither_skip_nor_repeat_while_events_are_written(backend: Backend) {
    let app = spawn_app(backend).await;
    const WRITERS: usize = 6;
    const EACH: usize = 10;
    let writing = async {
        join_all((0..WRITERS).map(|_| async {
            for _ in 0..EACH {
                created(app.post_charge(ACME, &new_key(), &visa(100)).await).await;
            }
        }))
        .await;
    };
    let reading = async {
        let mut followed: Vec<Value> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while followed.len() < WRITERS * EACH && Instant::now() < deadline {
            let cursor = followed
                .last()
                .map(|e| e["id"].as_str().expect("id").to_owned());
            followed.extend(read_from(&app, ACME, cursor.as_deref(), 4).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        followed
    };
    let ((), followed) = tokio::join!(writing, reading);

    let ids: Vec<&str> = followed
        .iter()
        .map(|e| e["id"].as_str().expect("id"))
        .collect();
    let distinct: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "an event was read twice");
    let afterwards = read_from(&app, ACME, None, 100).await;
    let all: Vec<&str> = afterwards
        .iter()
        .map(|e| e["id"].as_str().expect("id"))
        .collect();
    assert_eq!(all.len(), WRITERS * EACH);
    assert_eq!(
        ids, all,
        "the follower saw every event, in the feed's order"
    );
}

/// Without Redis nothing marks an outbox row published, and `GET /events` is its only reader:
/// rows go once they are older than the retention.
async fn without_a_stream_events_past_their_retention_are_pruned(backend: Backend) {
    let app = spawn_app_with(
        backend,
        &[
            ("PAYMENTS__REDIS__URL", ""),
            ("PAYMENTS__WORKERS__OUTBOX_RETENTION_SECS", "1"),
            ("PAYMENTS__WORKERS__REAPER_INTERVAL_MS", "200"),
        ],
    )
    .await;
    created(app.post_charge(ACME, &new_key(), &visa(100)).await).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = read_from(&app, ACME, None, 10).await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the event was never pruned: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

on_every_backend!(
    every_event_of_the_tenant_is_listed_in_order_and_none_of_another,
    pages_neither_skip_nor_repeat_while_events_are_written,
    without_a_stream_events_past_their_retention_are_pruned,
);
