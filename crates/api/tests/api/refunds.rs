//! Refunds (`refunds.create`) on the same exactly-once protocol as charges: a replay is the
//! same bytes, the refundable amount is reserved before the processor is called so that
//! refunds under different keys never give back more than the charge, and every refund is
//! posted to the ledger and the outbox exactly once.

use std::collections::HashSet;

use futures::future::join_all;
use serde_json::{Value, json};

use crate::helpers::{
    ACME, Backend, GLOBEX, REPLAY_HEADERS, TestApp, assert_ledger_balances,
    assert_replays_first_answer, concurrent_until_finished_in_a_batch, count_rows, new_key,
    problem, snapshot, spawn_app, with_card_sim,
};

/// The charge's refunded and reserved amounts, as the database holds them.
async fn refunded_and_reserved(app: &TestApp) -> (i64, i64) {
    sqlx::query_as("SELECT amount_refunded, amount_reserved FROM charges")
        .fetch_one(app.db())
        .await
        .expect("the one charge")
}

/// The processor still owes what was charged and not refunded.
async fn processor_receivable(app: &TestApp) -> i64 {
    let balances: Value = app.get_json(ACME, "/ledger/balances").await;
    balances["balances"]
        .as_array()
        .expect("balances array")
        .iter()
        .filter(|b| b["account"] == "processor_receivable")
        .map(|b| b["balance"].as_i64().expect("balance"))
        .sum()
}

async fn a_refund_and_its_replay_are_the_same_bytes_and_another_amount_is_422(backend: Backend) {
    let app = spawn_app(backend).await;
    let charge = app.charged(5_000, "tok_visa").await;
    let key = new_key();
    let body = json!({ "amount": 1_200, "reason": "requested_by_customer" });

    let first = app.post_refund(ACME, &charge, &key, &body).await;
    let (status, headers, bytes) = snapshot(first, &REPLAY_HEADERS).await;
    assert_eq!(status, 201);
    let refund: Value = serde_json::from_slice(&bytes).expect("refund JSON");
    let id = refund["id"].as_str().expect("refund id");
    assert!(id.starts_with("re_"), "{refund}");
    assert_eq!(refund["object"], "refund");
    assert_eq!(refund["charge"], charge.as_str());
    assert_eq!(refund["amount"], 1_200);
    assert_eq!(refund["currency"], "USD");
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["reason"], "requested_by_customer");
    assert!(refund["processor_refund_id"].is_string(), "{refund}");
    assert_eq!(
        headers[1].as_deref(),
        Some(format!("/refunds/{id}").as_str())
    );
    assert_eq!(headers[3], None);

    let replay = app.post_refund(ACME, &charge, &key, &body).await;
    assert_replays_first_answer(replay, &headers, &bytes).await;

    let other_amount = json!({ "amount": 1_300, "reason": "requested_by_customer" });
    let reused = app.post_refund(ACME, &charge, &key, &other_amount).await;
    let (status, problem) = problem(reused).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );

    // The same key and body on another charge is another request too.
    let other_charge = app.charged(5_000, "tok_visa").await;
    let elsewhere = app.post_refund(ACME, &other_charge, &key, &body).await;
    assert_eq!(elsewhere.status().as_u16(), 422);

    assert_eq!(count_rows(app.db(), "refunds").await, 1);
    let shown: Value = app.get_json(ACME, &format!("/refunds/{id}")).await;
    assert_eq!(
        shown, refund,
        "GET /refunds/{{id}} shows the refund as it was answered"
    );
    let charge_view: Value = app.get_json(ACME, &format!("/charges/{charge}")).await;
    assert_eq!(charge_view["amount_refunded"], 1_200);
    let list: Value = app
        .get_json(ACME, &format!("/charges/{charge}/refunds"))
        .await;
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"], json!([refund]));
    assert_eq!(list["has_more"], false);
    assert_eq!(processor_receivable(&app).await, 5_000 - 1_200 + 5_000);
    assert_ledger_balances(&app).await;
}

async fn twenty_concurrent_refunds_of_a_tenth_under_twenty_keys_never_over_refund(
    backend: Backend,
) {
    let (card_sim, app) = with_card_sim(backend).await;
    let charge = app.charged(10_000, "tok_visa").await;
    let body = json!({ "amount": 1_000 });

    let answers = join_all((0..20).map(|_| async {
        let response = app.post_refund(ACME, &charge, &new_key(), &body).await;
        let status = response.status().as_u16();
        let answer: Value = response.json().await.expect("JSON");
        (status, answer)
    }))
    .await;

    let created: HashSet<&str> = answers
        .iter()
        .filter(|(status, _)| *status == 201)
        .map(|(_, refund)| refund["id"].as_str().expect("id"))
        .collect();
    assert_eq!(created.len(), 10, "{answers:?}");
    let too_large = answers
        .iter()
        .filter(|(status, p)| *status == 400 && p["code"] == "refund_amount_too_large")
        .count();
    assert_eq!(too_large, 10, "{answers:?}");
    assert_eq!(card_sim.refunds_created().await, 10);
    assert_eq!(refunded_and_reserved(&app).await, (10_000, 10_000));
    let charge_view: Value = app.get_json(ACME, &format!("/charges/{charge}")).await;
    assert_eq!(charge_view["amount_refunded"], 10_000);
    assert_eq!(count_rows(app.db(), "refunds").await, 10);
    assert_eq!(count_rows(app.db(), "ledger_transactions").await, 1 + 10);
    assert_eq!(count_rows(app.db(), "outbox_events").await, 1 + 10);
    assert_eq!(processor_receivable(&app).await, 0);
    assert_ledger_balances(&app).await;

    // Nothing is left: a refund of the rest is a final answer, stored and replayed.
    let key = new_key();
    let rest = app.post_refund(ACME, &charge, &key, &json!({})).await;
    let (status, _, first) = snapshot(rest, &[]).await;
    let problem: Value = serde_json::from_slice(&first).expect("problem");
    assert_eq!(
        (status, problem["code"].as_str()),
        (400, Some("charge_already_refunded"))
    );
    let again = app.post_refund(ACME, &charge, &key, &json!({})).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.expect("body").to_vec(), first);
}

async fn a_hundred_concurrent_duplicates_of_one_refund_refund_once(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let charge = app.charged(10_000, "tok_visa").await;
    let key = new_key();
    let body = json!({ "amount": 2_500 });

    let answers = join_all((0..100).map(|_| async {
        let response = app.post_refund(ACME, &charge, &key, &body).await;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        (
            status,
            replayed,
            response.bytes().await.expect("body").to_vec(),
        )
    }))
    .await;

    let created: HashSet<&Vec<u8>> = answers
        .iter()
        .filter(|a| a.0 == 201)
        .map(|a| &a.2)
        .collect();
    assert_eq!(created.len(), 1, "every 201 is the same refund");
    assert_eq!(answers.iter().filter(|a| a.0 == 201 && !a.1).count(), 1);
    assert!(
        answers.iter().all(|a| a.0 == 201 || a.0 == 409),
        "duplicates are answered 201 (replay) or 409"
    );
    assert_eq!(card_sim.refunds_created().await, 1);
    assert_eq!(count_rows(app.db(), "refunds").await, 1);
    assert_eq!(refunded_and_reserved(&app).await, (2_500, 2_500));
    assert_eq!(count_rows(app.db(), "ledger_transactions").await, 2);
    assert_eq!(count_rows(app.db(), "outbox_events").await, 2);
    assert_ledger_balances(&app).await;
}

async fn a_declined_refund_replays_its_402_and_releases_its_reservation(backend: Backend) {
    let app = spawn_app(backend).await;
    let charge = app.charged(3_000, "tok_refundDeclined").await;
    let key = new_key();
    let body = json!({ "amount": 3_000 });

    let declined = app.post_refund(ACME, &charge, &key, &body).await;
    let (status, headers, first) = snapshot(declined, &["content-type"]).await;
    assert_eq!(status, 402);
    assert_eq!(headers[0].as_deref(), Some("application/problem+json"));
    let problem: Value = serde_json::from_slice(&first).expect("problem");
    assert_eq!(problem["code"], "refund_declined");
    assert!(problem["decline_code"].is_string(), "{problem}");

    let replay = app.post_refund(ACME, &charge, &key, &body).await;
    assert_eq!(replay.status().as_u16(), 402);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body").to_vec(), first);

    assert_eq!(
        refunded_and_reserved(&app).await,
        (0, 0),
        "the declined refund's reservation is released"
    );
    assert_eq!(count_rows(app.db(), "refunds").await, 0);
    assert_eq!(count_rows(app.db(), "ledger_transactions").await, 1);
    assert_eq!(count_rows(app.db(), "outbox_events").await, 1);
}

async fn a_refund_of_another_tenants_charge_is_404_and_leaves_the_key_free(backend: Backend) {
    let app = spawn_app(backend).await;
    let charge = app.charged(3_000, "tok_visa").await;
    let key = new_key();
    let body = json!({ "amount": 100 });

    for path_charge in [charge.as_str(), "ch_not-a-charge"] {
        let response = app.post_refund(GLOBEX, path_charge, &key, &body).await;
        let (status, problem) = problem(response).await;
        assert_eq!((status, problem["code"].as_str()), (404, Some("not_found")));
    }
    let listed = app.get(GLOBEX, &format!("/charges/{charge}/refunds")).await;
    assert_eq!(listed.status().as_u16(), 404);
    assert_eq!(
        count_rows(app.db(), "idempotency_records").await,
        1,
        "only the charge's key"
    );

    // The owner's refund, and another tenant cannot read it either.
    let refund = app.post_refund(ACME, &charge, &key, &body).await;
    assert_eq!(refund.status().as_u16(), 201);
    let refund: Value = refund.json().await.expect("refund");
    let id = refund["id"].as_str().expect("id");
    assert_eq!(
        app.get(GLOBEX, &format!("/refunds/{id}"))
            .await
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        app.get(ACME, &format!("/refunds/{id}"))
            .await
            .status()
            .as_u16(),
        200
    );
    assert_eq!(refunded_and_reserved(&app).await, (100, 100));
}

async fn a_refund_without_an_amount_refunds_what_is_left_and_bad_bodies_are_400(backend: Backend) {
    let app = spawn_app(backend).await;
    let charge = app.charged(3_000, "tok_visa").await;
    for bad in [
        json!({ "amount": 0 }),
        json!({ "amount": -5 }),
        json!({ "amount": "10" }),
        json!({ "reason": "because" }),
        json!({ "amount": null }),
        json!({ "reason": null }),
        json!({ "charge": charge }),
        json!([]),
    ] {
        let response = app.post_refund(ACME, &charge, &new_key(), &bad).await;
        let (status, problem) = problem(response).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}"
        );
    }
    assert_eq!(
        count_rows(app.db(), "idempotency_records").await,
        1,
        "no key consumed"
    );

    let part = json!({ "amount": 1_000 });
    let part = app.post_refund(ACME, &charge, &new_key(), &part).await;
    assert_eq!(part.status().as_u16(), 201);
    let too_much = json!({ "amount": 2_001 });
    let too_much = app.post_refund(ACME, &charge, &new_key(), &too_much).await;
    let (status, problem) = problem(too_much).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (400, Some("refund_amount_too_large"))
    );
    let rest = json!({ "reason": "duplicate" });
    let rest = app.post_refund(ACME, &charge, &new_key(), &rest).await;
    let rest: Value = rest.json().await.expect("refund");
    assert_eq!(rest["amount"], 2_000, "{rest}");
    assert_eq!(rest["reason"], "duplicate");
    assert_eq!(refunded_and_reserved(&app).await, (3_000, 3_000));

    let page: Value = app
        .get_json(ACME, &format!("/charges/{charge}/refunds?limit=1"))
        .await;
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["id"], rest["id"], "newest first");
    let cursor = rest["id"].as_str().expect("id");
    let next_page = format!("/charges/{charge}/refunds?limit=1&starting_after={cursor}");
    let next: Value = app.get_json(ACME, &next_page).await;
    assert_eq!(next["has_more"], false);
    assert_eq!(next["data"][0]["amount"], 1_000);
}

/// A key is scoped to its operation: the same key names a charge and a refund, and key
/// inspection shows each under its operation.
async fn the_same_key_names_a_charge_and_a_refund_each_inspected_under_its_operation(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let key = new_key();
    let charge = app
        .post_charge(
            ACME,
            &key,
            &json!({ "amount": 900, "currency": "usd", "source": "tok_visa" }),
        )
        .await;
    assert_eq!(charge.status().as_u16(), 201);
    let charge: Value = charge.json().await.expect("charge");
    let charge = charge["id"].as_str().expect("id");
    let refund = app.post_refund(ACME, charge, &key, &json!({})).await;
    assert_eq!(
        refund.status().as_u16(),
        201,
        "the charge's key is free for a refund"
    );

    // A family, or the versioned name keys were scoped by before (still accepted).
    for (asked, family) in [
        ("charges.create", "charges.create"),
        ("refunds.create", "refunds.create"),
        ("charges.create.v1", "charges.create"),
        ("refunds.create.v1", "refunds.create"),
    ] {
        let shown = app
            .get_json(ACME, &format!("/idempotency-keys/{key}?operation={asked}"))
            .await;
        assert_eq!(shown["operation"], family);
        assert_eq!(shown["response_status"], 201);
    }
    let by_default = app
        .get_json(ACME, &format!("/idempotency-keys/{key}"))
        .await;
    assert_eq!(by_default["operation"], "charges.create");
    let unknown = app
        .get(
            ACME,
            &format!("/idempotency-keys/{key}?operation=transfers.create"),
        )
        .await;
    let (status, problem) = problem(unknown).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (400, Some("invalid_request"))
    );
}

/// On PostgreSQL, concurrent refunds' finishes share a transaction and a commit: a batch
/// writes each of its refunds once, one after the other on the same charge, so that the
/// processor, the refund rows, the ledger, the outbox and the charge's refunded amount all
/// count every refund exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_refunds_finished_in_one_batch_are_each_written_once() {
    const CHARGED: i64 = 16_000;
    let (card_sim, app) = with_card_sim(Backend::Postgres).await;
    let charge = app.charged(CHARGED, "tok_visa").await;
    let body = json!({ "amount": 100 });
    let (app, charge, body) = (&app, &charge, &body);
    let refunds = concurrent_until_finished_in_a_batch(app, "refunds.create", |key| async move {
        app.post_refund(ACME, charge, &key, body).await
    })
    .await;

    assert_eq!(card_sim.refunds_created().await, refunds);
    assert_eq!(
        refunded_and_reserved(app).await,
        (refunds * 100, refunds * 100)
    );
    assert_eq!(count_rows(app.db(), "refunds").await, refunds);
    assert_eq!(
        count_rows(app.db(), "ledger_transactions").await,
        1 + refunds
    );
    assert_eq!(count_rows(app.db(), "outbox_events").await, 1 + refunds);
    assert_eq!(processor_receivable(app).await, CHARGED - refunds * 100);
    assert_ledger_balances(app).await;
}

on_every_backend!(
    the_same_key_names_a_charge_and_a_refund_each_inspected_under_its_operation,
    a_refund_and_its_replay_are_the_same_bytes_and_another_amount_is_422,
    twenty_concurrent_refunds_of_a_tenth_under_twenty_keys_never_over_refund,
    a_hundred_concurrent_duplicates_of_one_refund_refund_once,
    a_declined_refund_replays_its_402_and_releases_its_reservation,
    a_refund_of_another_tenants_charge_is_404_and_leaves_the_key_free,
    a_refund_without_an_amount_refunds_what_is_left_and_bad_bodies_are_400,
);
