//! Resolving reconciliation exceptions (`POST /ops/exceptions/{id}/resolve`), on the same
//! engine as every other effect: `record` posts a charge the books lost exactly once, `void`
//! gives back what a mismatched charge took and ends the record it held, `accept` changes
//! nothing but the exception; every resolution replays, and a second one changes nothing.

use reqwest::Response;
use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::helpers::{
    ACME, Backend, Footprint, TestApp, assert_ledger_balances, new_key, problem, snapshot, visa,
};
use crate::ops::{OPERATOR, OperatorConfig, with_operator};
use crate::reconciliation::reconcile;

/// A service on `card_sim` with an operator key, whose completer never runs on its own.
async fn operated(backend: Backend, card_sim: &CardSim) -> (OperatorConfig, TestApp) {
    with_operator(
        backend,
        &[
            ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
            ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "3600000"),
        ],
    )
    .await
}

/// `POST /ops/exceptions/{id}/resolve` under `key`.
async fn resolve(app: &TestApp, id: &str, key: &str, body: &Value) -> Response {
    resolve_at(&app.url(&resolve_path(id)), key, body)
        .await
        .expect("POST /ops/exceptions/{id}/resolve")
}

pub(crate) fn resolve_path(id: &str) -> String {
    format!("/ops/exceptions/{id}/resolve")
}

/// A resolution sent to `url` with the operator's key under `key`.
pub(crate) async fn resolve_at(url: &str, key: &str, body: &Value) -> reqwest::Result<Response> {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(OPERATOR)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
}

/// The one open exception about `processor_id`.
async fn open_exception(app: &TestApp, processor_id: &str) -> Value {
    let open = app.get_json(OPERATOR, "/ops/exceptions?limit=100").await;
    open["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|e| e["processor_id"] == processor_id)
        .unwrap_or_else(|| panic!("no open exception about {processor_id}: {open}"))
        .clone()
}

/// Deletes a charge from the books by hand, as a bad script or an old backup would: its
/// ledger transaction, its event, the charge and its idempotency record.
pub(crate) async fn delete_the_books(db: &sqlx::AnyPool) {
    for table in [
        "ledger_entries",
        "ledger_transactions",
        "outbox_events",
        "charges",
        "idempotency_records",
    ] {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(db)
            .await
            .unwrap_or_else(|e| panic!("delete from {table}: {e}"));
    }
}

async fn record_posts_a_charge_the_books_lost_exactly_once(backend: Backend) {
    let card_sim = CardSim::start().await;
    let (_config, app) = operated(backend, &card_sim).await;
    let response = app.post_charge(ACME, &new_key(), &visa(700)).await;
    assert_eq!(response.status().as_u16(), 201);
    let charge: Value = response.json().await.expect("charge");
    let processor_id = charge["processor_charge_id"]
        .as_str()
        .expect("processor id");
    delete_the_books(app.db()).await;

    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(
        (status, &run["counts"]["processor_only"]),
        (3, &json!(1)),
        "{run}"
    );
    let exception = open_exception(&app, processor_id).await;
    let id = exception["id"].as_str().expect("id");
    assert_eq!(exception["tenant"], "acme");

    let key = new_key();
    let body = json!({ "action": "record", "note": "restored from an old backup" });
    let (status, headers, bytes) = snapshot(
        resolve(&app, id, &key, &body).await,
        &["idempotent-replayed"],
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let resolved: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(headers[0], None, "the first answer is no replay");
    assert_eq!(resolved["status"], "resolved");
    assert_eq!(resolved["resolution"]["action"], "record");
    assert_eq!(resolved["resolution"]["operator"], "alice");
    assert_eq!(
        resolved["resolution"]["note"],
        "restored from an old backup"
    );
    assert_eq!(resolved["resolution"]["recorded_id"], charge["id"]);
    // The charge, its ledger transaction and its event, once; the resolution's own record.
    let posted = Footprint::charged(1);
    assert_eq!(app.footprint().await, posted);
    assert_ledger_balances(&app).await;
    let path = format!("/charges/{}", charge["id"].as_str().expect("charge id"));
    let restored = app.get_json(ACME, &path).await;
    assert_eq!(
        (&restored["amount"], &restored["processor_charge_id"]),
        (&json!(700), &json!(processor_id))
    );

    // The same key replays the same bytes; another key changes nothing.
    let (status, headers, replayed) = snapshot(
        resolve(&app, id, &key, &body).await,
        &["idempotent-replayed"],
    )
    .await;
    assert_eq!((status, headers[0].as_deref()), (200, Some("true")));
    assert_eq!(replayed, bytes);
    let (status, again) = problem(resolve(&app, id, &new_key(), &body).await).await;
    assert_eq!(
        (status, again["code"].as_str()),
        (400, Some("exception_already_resolved"))
    );
    assert_eq!(
        app.footprint().await,
        Footprint {
            records: 2,
            ..posted
        },
        "a second record posts nothing"
    );

    let mut shown = app
        .get_json(OPERATOR, &format!("/ops/exceptions/{id}"))
        .await;
    let mut answered = resolved.clone();
    for view in [&mut shown, &mut answered] {
        view["age_secs"] = Value::Null;
    }
    assert_eq!(shown, answered);
    // The books now hold what the processor reported.
    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!((status, &run["counts"]["matched"]), (0, &json!(1)), "{run}");
}

/// `tok_amountMismatch` makes the processor charge one minor unit more than asked, so the
/// request answers 503 and its record stays pending, never posted; the run keeps it as a
/// `processor_mismatch`. A void refunds all the processor took, under the resolution's own
/// key, and ends the held record: the client's retry is told the charge was voided.
async fn void_gives_back_a_mismatched_charge_and_ends_the_record_it_held(backend: Backend) {
    let card_sim = CardSim::start().await;
    let (_config, app) = operated(backend, &card_sim).await;
    let charge_key = new_key();
    let body = json!({ "amount": 500, "currency": "usd", "source": "tok_amountMismatch" });
    let (status, _) = problem(app.post_charge(ACME, &charge_key, &body).await).await;
    assert_eq!(status, 503);
    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(
        (status, &run["counts"]["processor_mismatch"]),
        (3, &json!(1)),
        "{run}"
    );
    let held = &run["items"][0];
    let exception = open_exception(&app, held["processor_id"].as_str().expect("id")).await;
    let id = exception["id"].as_str().expect("id");

    let key = new_key();
    let void = json!({ "action": "void", "note": "the processor charged 501 for 500" });
    let (status, _, bytes) = snapshot(resolve(&app, id, &key, &void).await, &[]).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let resolved: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(resolved["resolution"]["action"], "void");
    assert!(
        resolved["resolution"]["void_processor_id"].is_string(),
        "{resolved}"
    );
    assert_eq!(
        card_sim.refunds_created().await,
        1,
        "the processor gave it back"
    );

    // The held record has its final answer, replayed to every retry of the charge.
    let (status, voided) = problem(app.post_charge(ACME, &charge_key, &body).await).await;
    assert_eq!(
        (status, voided["code"].as_str()),
        (402, Some("charge_voided"))
    );
    let (status, _) = problem(app.post_charge(ACME, &charge_key, &body).await).await;
    assert_eq!(status, 402);
    let books = app.footprint().await;
    assert_eq!(
        (
            books.charges,
            books.ledger_transactions,
            books.outbox_events
        ),
        (0, 0, 0),
        "nothing was charged, so nothing is posted"
    );

    // The same key replays; another key gives nothing back twice.
    let (status, _, replayed) = snapshot(resolve(&app, id, &key, &void).await, &[]).await;
    assert_eq!((status, replayed), (200, bytes));
    let (status, again) = problem(resolve(&app, id, &new_key(), &void).await).await;
    assert_eq!(
        (status, again["code"].as_str()),
        (400, Some("exception_already_resolved"))
    );
    assert_eq!(card_sim.refunds_created().await, 1);

    // The next run over the day: the voided charge is resolved, and its refund is in the books.
    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(status, 0, "{run}");
    assert_eq!(
        (&run["counts"]["resolved"], &run["counts"]["matched"]),
        (&json!(1), &json!(1)),
        "{run}"
    );
}

/// An accepted exception changes nothing but itself; an action that does not fit the
/// exception's kind is refused before the claim, and the key stays free.
async fn accept_closes_an_exception_and_a_misfit_action_leaves_the_key_free(backend: Backend) {
    let card_sim = CardSim::start().await;
    let (_config, app) = operated(backend, &card_sim).await;
    let response = app.post_charge(ACME, &new_key(), &visa(600)).await;
    let charge: Value = response.json().await.expect("charge");
    let processor_id = charge["processor_charge_id"]
        .as_str()
        .expect("processor id");
    card_sim.drop_from_report(processor_id).await;
    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(
        (status, &run["counts"]["books_only"]),
        (3, &json!(1)),
        "{run}"
    );
    let exception = open_exception(&app, processor_id).await;
    let id = exception["id"].as_str().expect("id");
    let before = app.footprint().await;

    let key = new_key();
    for action in ["record", "void"] {
        let misfit = json!({ "action": action, "note": "the processor has no line" });
        let (status, body) = problem(resolve(&app, id, &key, &misfit).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("resolution_not_applicable")),
            "{action}"
        );
    }
    for (body, field) in [
        (json!({ "action": "close", "note": "x" }), "action"),
        (json!({ "action": "accept", "note": " " }), "note"),
    ] {
        let (status, problem) = problem(resolve(&app, id, &key, &body).await).await;
        assert_eq!(status, 400);
        let detail = problem["detail"].as_str().expect("detail");
        assert!(detail.starts_with(field), "{detail}");
    }
    let (status, body) = problem(
        resolve(
            &app,
            id,
            &key,
            &json!({ "action": "accept", "note": "4242 4242 4242 4242" }),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("card_number_not_allowed"))
    );
    let (status, body) = problem(resolve(&app, "exc_nope", &key, &visa(1)).await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, body) = problem(
        reqwest::Client::new()
            .post(app.url(&format!("/ops/exceptions/{id}/resolve")))
            .bearer_auth(ACME)
            .header("Idempotency-Key", &key)
            .json(&json!({ "action": "accept", "note": "a tenant cannot" }))
            .send()
            .await
            .expect("POST"),
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (403, Some("forbidden")));

    // Every refusal above left the key free: it resolves the exception now.
    let accept = json!({ "action": "accept", "note": "the processor settles it tomorrow" });
    let response = resolve(&app, id, &key, &accept).await;
    assert_eq!(response.status().as_u16(), 200);
    let resolved: Value = response.json().await.expect("JSON");
    assert_eq!(resolved["resolution"]["action"], "accept");
    assert_eq!(resolved["resolution"]["recorded_id"], Value::Null);
    assert_eq!(
        app.footprint().await,
        Footprint {
            records: before.records + 1,
            ..before
        },
        "an accept posts nothing"
    );
    // An operator's keys are not a tenant's to inspect, whoever's name matches.
    let inspect = format!("/idempotency-keys/{key}?operation=exceptions.resolve");
    let (status, body) = problem(app.get(ACME, &inspect).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let listed = app
        .get_json(OPERATOR, "/ops/exceptions?status=resolved")
        .await;
    assert_eq!(listed["data"][0]["id"], json!(id));
    assert_eq!(
        app.get_json(OPERATOR, "/ops/exceptions").await["data"],
        json!([])
    );

    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(
        (status, &run["counts"]["resolved"]),
        (0, &json!(1)),
        "{run}"
    );
}

/// Eight operators' voids of one exception under eight keys, all at once: the exception is
/// held by the first, so exactly one reaches the processor, and every other changes nothing.
async fn concurrent_voids_under_different_keys_give_back_once(backend: Backend) {
    let card_sim = CardSim::start().await;
    let (_config, app) = operated(backend, &card_sim).await;
    let processor_id = card_sim.unsolicited_charge("made-elsewhere", 900).await;
    let (status, _) = reconcile(&app.database, &card_sim).await;
    assert_eq!(status, 3);
    let exception = open_exception(&app, &processor_id).await;
    let id = exception["id"].as_str().expect("id").to_owned();

    let void = json!({ "action": "void", "note": "nobody here asked for this charge" });
    let voids = (0..8).map(|_| {
        let (app, id, void) = (&app, &id, &void);
        async move { problem_or_ok(resolve(app, id, &new_key(), void).await).await }
    });
    let mut answers: Vec<(u16, Option<String>)> = futures::future::join_all(voids).await;
    answers.sort();
    let resolved = answers.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(resolved, 1, "{answers:?}");
    for (status, code) in &answers[1..] {
        let refused = matches!(
            (status, code.as_deref()),
            (400, Some("exception_already_resolved")) | (409, Some("exception_being_resolved"))
        );
        assert!(refused, "{answers:?}");
    }
    assert_eq!(
        card_sim.refunds_created().await,
        1,
        "one void reached the processor"
    );
    let shown = app
        .get_json(OPERATOR, &format!("/ops/exceptions/{id}"))
        .await;
    assert_eq!(shown["status"], "resolved");
}

/// The status of a response, and its problem's `code` unless it is a 200.
async fn problem_or_ok(response: Response) -> (u16, Option<String>) {
    if response.status().as_u16() == 200 {
        return (200, None);
    }
    let (status, body) = problem(response).await;
    (status, body["code"].as_str().map(str::to_owned))
}

on_every_backend!(
    concurrent_voids_under_different_keys_give_back_once,
    record_posts_a_charge_the_books_lost_exactly_once,
    void_gives_back_a_mismatched_charge_and_ends_the_record_it_held,
    accept_closes_an_exception_and_a_misfit_action_leaves_the_key_free,
);
