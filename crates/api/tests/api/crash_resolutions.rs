//! A resolution cut off by a crash after its effect: the service is aborted once the
//! processor has refunded a void (or confirmed a record), restarted on the same database
//! against the same card-sim, and the operator never retries, or retries later. A void is
//! finished by the completer with exactly one refund at the processor; a record, which makes
//! nothing under its own key, is failed by the completer, its exception let go, and the
//! operator's retry posts the charge exactly once.

use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::crash::{crash_env, post_to, settings, start, wait_until_settled};
use crate::helpers::{Footprint, Service, TestDatabase, http_client, new_key, problem, visa};
use crate::ops::{OPERATOR, OperatorConfig};
use crate::reconciliation::reconcile;
use crate::resolutions::{delete_the_books, resolve_at, resolve_path};

/// The one exception the service lists, open or `status`.
async fn the_exception(service: &Service, status: &str) -> Value {
    let list: Value = http_client()
        .get(service.url(&format!("/ops/exceptions?status={status}")))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .expect("GET /ops/exceptions")
        .json()
        .await
        .expect("JSON");
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1), "{list}");
    list["data"][0].clone()
}

/// The service aborted at `point` of the resolution `body` of the one open exception under
/// `key`, then restarted; returns the restarted service.
async fn crash_resolving(
    db: &TestDatabase,
    settings: &[(&'static str, String)],
    config: &OperatorConfig,
    key: &str,
    body: &Value,
) -> Service {
    let operator = ("PAYMENTS_CONFIG", config.path());
    let service = start(db, settings, &[operator]).await;
    let id = the_exception(&service, "open").await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    drop(service);
    let mut env = crash_env("after_charge");
    env.push(operator);
    let mut crashing = start(db, settings, &env).await;
    let url = crashing.url(&resolve_path(&id));
    assert!(
        resolve_at(&url, key, body).await.is_err(),
        "the service dies before it answers"
    );
    assert!(!crashing.wait_exit().await, "the service was aborted");
    start(db, settings, &[operator]).await
}

async fn a_void_cut_off_after_the_processor_refunded_is_finished_by_the_completer(
    backend: crate::helpers::Backend,
) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let config = OperatorConfig::write();
    let charge_key = new_key();
    let mismatched = json!({ "amount": 500, "currency": "usd", "source": "tok_amountMismatch" });
    {
        let service = start(&db, &settings, &[]).await;
        let response = post_to(&service, "/charges", &charge_key, &mismatched).await;
        assert_eq!(response.expect("answer").status().as_u16(), 503);
    }
    let (status, _) = reconcile(&db, &card_sim).await;
    assert_eq!(status, 3);

    let key = new_key();
    let void = json!({ "action": "void", "note": "charged 501 for 500" });
    let service = crash_resolving(&db, &settings, &config, &key, &void).await;
    assert_eq!(wait_until_settled(&db, &key).await, "completed");
    assert_eq!(card_sim.refunds_created().await, 1);
    let resolved = the_exception(&service, "resolved").await;
    assert_eq!(resolved["resolution"]["action"], "void");

    // The operator's retry replays what the completer stored; the held charge is voided.
    let url = service.url(&resolve_path(resolved["id"].as_str().expect("id")));
    let replay = resolve_at(&url, &key, &void).await.expect("answer");
    assert_eq!(replay.status().as_u16(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let response = post_to(&service, "/charges", &charge_key, &mismatched).await;
    let (status, voided) = problem(response.expect("answer")).await;
    assert_eq!(
        (status, voided["code"].as_str()),
        (402, Some("charge_voided"))
    );
    assert_eq!(card_sim.refunds_created().await, 1);
}

async fn a_record_cut_off_after_the_processor_confirmed_is_failed_and_its_retry_posts_once(
    backend: crate::helpers::Backend,
) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    let settings = settings(&card_sim);
    let config = OperatorConfig::write();
    {
        let service = start(&db, &settings, &[]).await;
        let response = post_to(&service, "/charges", &new_key(), &visa(700)).await;
        assert_eq!(response.expect("answer").status().as_u16(), 201);
    }
    delete_the_books(&db.pool).await;
    let (status, _) = reconcile(&db, &card_sim).await;
    assert_eq!(status, 3);

    let key = new_key();
    let record = json!({ "action": "record", "note": "lost in a restore" });
    let service = crash_resolving(&db, &settings, &config, &key, &record).await;
    // Nothing was made under the resolution's own key: the completer fails it, and the
    // exception is free again, still open.
    assert_eq!(wait_until_settled(&db, &key).await, "failed");
    let open = the_exception(&service, "open").await;
    assert_eq!(Footprint::of(&db.pool).await.charges, 0);

    let url = service.url(&resolve_path(open["id"].as_str().expect("id")));
    let response = resolve_at(&url, &key, &record).await.expect("answer");
    assert_eq!(response.status().as_u16(), 200);
    let first = response.bytes().await.expect("body");
    let replay = resolve_at(&url, &key, &record).await.expect("answer");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body"), first);
    let books = Footprint::of(&db.pool).await;
    assert_eq!(
        (
            books.charges,
            books.ledger_transactions,
            books.outbox_events
        ),
        (1, 1, 1)
    );
    assert_eq!(card_sim.charges_created().await, 1);
}

on_every_backend!(
    a_void_cut_off_after_the_processor_refunded_is_finished_by_the_completer,
    a_record_cut_off_after_the_processor_confirmed_is_failed_and_its_retry_posts_once,
);
