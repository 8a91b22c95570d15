//! Payouts (`payouts.create`) on the same exactly-once protocol as charges and refunds: a
//! replay is the same bytes, a payout is judged against the tenant's balance and reserves its
//! amount before the processor is called, so that payouts and refunds under any keys never
//! take the balance below zero, and every paid payout is posted to the ledger and the outbox
//! exactly once.

use std::collections::HashSet;

use futures::future::join_all;
use reqwest::Response;
use serde_json::{Value, json};

use crate::helpers::{
    ACME, Backend, GLOBEX, REPLAY_HEADERS, TestApp, assert_ledger_balances,
    assert_replays_first_answer, concurrent_until_finished_in_a_batch, count_rows, new_key, payout,
    problem, snapshot, spawn_app, with_card_sim,
};

/// The tenant's balance as `GET /balance` shows it.
async fn balance(app: &TestApp, api_key: &str) -> Value {
    app.get_json(api_key, "/balance").await
}

/// A balance of `amount` available in USD with no payout in flight.
fn available_usd(amount: i64) -> Value {
    json!({
        "object": "balance",
        "available": [{ "amount": amount, "currency": "USD" }],
        "pending": [],
    })
}

/// acme's ledger balance of `account` (every test here works in one currency).
async fn ledger_balance(app: &TestApp, account: &str) -> i64 {
    let balances: Value = app.get_json(ACME, "/ledger/balances").await;
    balances["balances"]
        .as_array()
        .expect("balances array")
        .iter()
        .filter(|b| b["account"] == account)
        .map(|b| b["balance"].as_i64().expect("balance"))
        .sum()
}

/// The paid payout rows: how many, and the amount they add up to.
async fn paid_payouts(app: &TestApp) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*), CAST(COALESCE(sum(amount), 0) AS BIGINT) FROM payouts
         WHERE status = 'paid'",
    )
    .fetch_one(app.db())
    .await
    .expect("paid payouts")
}

/// Ledger transactions that post a payout (and, by the schema, no charge).
async fn payout_transactions(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM ledger_transactions
         WHERE payout_id IS NOT NULL AND charge_id IS NULL",
    )
    .fetch_one(app.db())
    .await
    .expect("payout transactions")
}

/// The payouts named by `payout.paid` events, as public `po_` ids.
async fn paid_events(app: &TestApp) -> Vec<String> {
    let sql = format!(
        "SELECT {} FROM outbox_events WHERE event_type = 'payout.paid'",
        app.database.uuid_text("aggregate_id")
    );
    let ids: Vec<String> = sqlx::query_scalar(&sql)
        .fetch_all(app.db())
        .await
        .expect("payout events");
    ids.into_iter().map(|id| format!("po_{id}")).collect()
}

/// The status and JSON body of a response.
async fn status_and_json(response: Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

async fn a_payout_and_its_replay_are_byte_identical_and_another_amount_under_the_key_is_422(
    backend: Backend,
) {
    let (card_sim, app) = with_card_sim(backend).await;
    app.charged(10_000, "tok_visa").await;
    let key = new_key();

    let first = app.post_payout(ACME, &key, &payout(2_500)).await;
    let (status, headers, bytes) = snapshot(first, &REPLAY_HEADERS).await;
    assert_eq!(status, 201);
    let paid: Value = serde_json::from_slice(&bytes).expect("payout JSON");
    let id = paid["id"].as_str().expect("payout id");
    assert!(id.starts_with("po_"), "{paid}");
    assert_eq!(paid["object"], "payout");
    assert_eq!(paid["amount"], 2_500);
    assert_eq!(paid["currency"], "USD");
    assert_eq!(paid["destination"], "ba_checking");
    assert_eq!(paid["description"], Value::Null);
    assert_eq!(paid["status"], "paid");
    assert!(paid["processor_payout_id"].is_string(), "{paid}");
    assert!(
        paid["created_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{paid}"
    );
    assert_eq!(
        headers[1].as_deref(),
        Some(format!("/payouts/{id}").as_str())
    );
    assert_eq!(headers[3], None);

    let replay = app.post_payout(ACME, &key, &payout(2_500)).await;
    assert_replays_first_answer(replay, &headers, &bytes).await;

    let reused = app.post_payout(ACME, &key, &payout(2_600)).await;
    let (status, problem) = problem(reused).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );

    let shown: Value = app.get_json(ACME, &format!("/payouts/{id}")).await;
    assert_eq!(
        shown, paid,
        "GET /payouts/{{id}} shows the payout as it was answered"
    );
    let list: Value = app.get_json(ACME, "/payouts").await;
    assert_eq!(
        list,
        json!({ "object": "list", "data": [paid], "has_more": false })
    );
    assert_eq!(balance(&app, ACME).await, available_usd(7_500));

    assert_eq!(card_sim.payouts_created().await, 1);
    assert_eq!(count_rows(app.db(), "payouts").await, 1);
    assert_eq!(paid_payouts(&app).await, (1, 2_500));
    assert_eq!(count_rows(app.db(), "ledger_transactions").await, 2);
    assert_eq!(payout_transactions(&app).await, 1);
    // Debits are positive, credits negative: the charge credited customer_payments, the
    // payout debits it again and credits the money on its way to the bank.
    assert_eq!(ledger_balance(&app, "processor_receivable").await, 10_000);
    assert_eq!(ledger_balance(&app, "customer_payments").await, -7_500);
    assert_eq!(ledger_balance(&app, "payouts_in_transit").await, -2_500);
    assert_ledger_balances(&app).await;
    assert_eq!(paid_events(&app).await, vec![id.to_owned()]);
}

async fn a_payout_over_the_available_balance_is_400_insufficient_balance_and_replays(
    backend: Backend,
) {
    let (card_sim, app) = with_card_sim(backend).await;
    app.charged(1_000, "tok_visa").await;
    let key = new_key();

    let refused = app.post_payout(ACME, &key, &payout(1_001)).await;
    let (status, headers, first) = snapshot(refused, &REPLAY_HEADERS).await;
    assert_eq!(status, 400);
    assert_eq!(headers[0].as_deref(), Some("application/problem+json"));
    assert!(headers[2].is_some(), "a stored answer says until when");
    let problem: Value = serde_json::from_slice(&first).expect("problem");
    assert_eq!(problem["code"], "insufficient_balance");
    assert_eq!(problem["available"], 1_000);

    // The refusal is the key's answer: money that arrives later does not change it.
    app.charged(5_000, "tok_visa").await;
    let replay = app.post_payout(ACME, &key, &payout(1_001)).await;
    assert_eq!(replay.status().as_u16(), 400);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body").to_vec(), first);

    assert_eq!(card_sim.payouts_created().await, 0);
    assert_eq!(count_rows(app.db(), "payouts").await, 0);
    assert_eq!(count_rows(app.db(), "ledger_transactions").await, 2);
    assert!(paid_events(&app).await.is_empty());
    assert_eq!(
        balance(&app, ACME).await,
        available_usd(6_000),
        "the refusal reserved nothing"
    );

    // Exactly what is available can be paid out.
    let all = app.post_payout(ACME, &new_key(), &payout(6_000)).await;
    assert_eq!(all.status().as_u16(), 201);
    assert_eq!(card_sim.payouts_created().await, 1);
    assert_eq!(paid_payouts(&app).await, (1, 6_000));
}

async fn a_declined_payout_replays_its_402_and_releases_its_reservation(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    app.charged(3_000, "tok_visa").await;
    let key = new_key();
    let body = json!({ "amount": 3_000, "currency": "usd", "destination": "ba_declined" });

    let declined = app.post_payout(ACME, &key, &body).await;
    let (status, headers, first) = snapshot(declined, &["content-type"]).await;
    assert_eq!(status, 402);
    assert_eq!(headers[0].as_deref(), Some("application/problem+json"));
    let problem: Value = serde_json::from_slice(&first).expect("problem");
    assert_eq!(problem["code"], "payout_declined");
    assert_eq!(problem["decline_code"], "account_closed");

    let replay = app.post_payout(ACME, &key, &body).await;
    assert_eq!(replay.status().as_u16(), 402);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body").to_vec(), first);

    assert_eq!(
        balance(&app, ACME).await,
        available_usd(3_000),
        "the declined payout's reservation is released"
    );
    assert_eq!(count_rows(app.db(), "payouts").await, 0);
    assert_eq!(card_sim.payouts_created().await, 0);
    assert_eq!(count_rows(app.db(), "ledger_transactions").await, 1);
    assert!(paid_events(&app).await.is_empty());

    // The released amount is really there: all of it can be paid out elsewhere.
    let elsewhere = app.post_payout(ACME, &new_key(), &payout(3_000)).await;
    assert_eq!(elsewhere.status().as_u16(), 201);
    assert_eq!(card_sim.payouts_created().await, 1);
    assert_eq!(paid_payouts(&app).await, (1, 3_000));
}

/// Payouts and balances belong to one tenant: another cannot read the payout, does not see it
/// listed, and cannot pay out of the first tenant's money.
async fn another_tenants_payout_is_404(backend: Backend) {
    let app = spawn_app(backend).await;
    app.charged(5_000, "tok_visa").await;
    let paid = app.post_payout(ACME, &new_key(), &payout(1_000)).await;
    assert_eq!(paid.status().as_u16(), 201);
    let paid: Value = paid.json().await.expect("payout");
    let id = paid["id"].as_str().expect("id");

    let (status, body) = problem(app.get(GLOBEX, &format!("/payouts/{id}")).await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    for unknown in [
        "po_00000000-0000-0000-0000-000000000000",
        "po_not-a-uuid",
        "ch_00000000-0000-0000-0000-000000000000",
    ] {
        let (status, body) = problem(app.get(ACME, &format!("/payouts/{unknown}")).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("not_found")),
            "{unknown}"
        );
    }
    let listed: Value = app.get_json(GLOBEX, "/payouts").await;
    assert_eq!(listed["data"], json!([]));
    assert_eq!(
        balance(&app, GLOBEX).await,
        json!({ "object": "balance", "available": [], "pending": [] })
    );

    let key = new_key();
    let (status, refused) = problem(app.post_payout(GLOBEX, &key, &payout(1_000)).await).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (400, Some("insufficient_balance"))
    );
    assert_eq!(refused["available"], 0);

    assert_eq!(app.get_json(ACME, &format!("/payouts/{id}")).await, paid);
    assert_eq!(balance(&app, ACME).await, available_usd(4_000));
    assert_eq!(count_rows(app.db(), "payouts").await, 1);
}

/// The headline guarantee: thirty payouts and refunds of one tenant, all in flight at once
/// under distinct keys, take out exactly what the balance holds and never more, and every
/// count agrees: the processor's, the rows', the ledger's and the outbox's.
async fn concurrent_payouts_and_refunds_never_take_the_balance_below_zero(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    // 21_000 available, and every payout and refund below asks for 2_000: in whatever order
    // they are judged, exactly ten fit, and the 1_000 left over fits none.
    let mut charges = Vec::new();
    for _ in 0..10 {
        charges.push(app.charged(2_100, "tok_visa").await);
    }
    let payout_keys: Vec<String> = (0..20).map(|_| new_key()).collect();
    let refund_keys: Vec<String> = (0..10).map(|_| new_key()).collect();
    let payout_body = payout(2_000);
    let refund_body = json!({ "amount": 2_000 });

    let (payouts, refunds) = tokio::join!(
        join_all(
            payout_keys
                .iter()
                .map(|key| app.post_payout(ACME, key, &payout_body))
        ),
        join_all(
            charges
                .iter()
                .zip(&refund_keys)
                .map(|(charge, key)| app.post_refund(ACME, charge, key, &refund_body))
        ),
    );
    let payouts = join_all(payouts.into_iter().map(status_and_json)).await;
    let refunds = join_all(refunds.into_iter().map(status_and_json)).await;

    for (status, body) in payouts.iter().chain(&refunds) {
        assert!(
            *status == 201 || (*status == 400 && body["code"] == "insufficient_balance"),
            "{status} {body}"
        );
    }
    for (_, refused) in payouts.iter().filter(|(status, _)| *status == 400) {
        assert!(
            refused["available"]
                .as_i64()
                .is_some_and(|available| (0..2_000).contains(&available)),
            "a payout is refused only when less than it asks for is available: {refused}"
        );
    }
    let paid: HashSet<String> = payouts
        .iter()
        .filter(|(status, _)| *status == 201)
        .map(|(_, payout)| payout["id"].as_str().expect("id").to_owned())
        .collect();
    let paid_out = paid.len() as i64;
    let refunded = refunds.iter().filter(|(status, _)| *status == 201).count() as i64;
    assert_eq!(
        paid_out + refunded,
        10,
        "payouts {payouts:?} refunds {refunds:?}"
    );

    assert_eq!(card_sim.payouts_created().await, paid_out);
    assert_eq!(paid_payouts(&app).await, (paid_out, 2_000 * paid_out));
    assert_eq!(
        count_rows(app.db(), "payouts").await,
        paid_out,
        "no reservation is left behind, and a refusal writes no row"
    );
    assert_eq!(
        paid_events(&app).await.into_iter().collect::<HashSet<_>>(),
        paid
    );
    assert_eq!(card_sim.refunds_created().await, refunded);
    assert_eq!(count_rows(app.db(), "refunds").await, refunded);
    assert_eq!(
        count_rows(app.db(), "ledger_transactions").await,
        10 + paid_out + refunded
    );
    assert_eq!(payout_transactions(&app).await, paid_out);

    let left = 21_000 - 2_000 * (paid_out + refunded);
    assert_eq!(balance(&app, ACME).await, available_usd(left));
    assert_eq!(ledger_balance(&app, "customer_payments").await, -left);
    assert_eq!(
        ledger_balance(&app, "payouts_in_transit").await,
        -2_000 * paid_out
    );
    assert_eq!(
        ledger_balance(&app, "processor_receivable").await,
        21_000 - 2_000 * refunded
    );
    assert_ledger_balances(&app).await;
}

/// A request refused before the claim stores nothing and leaves its key free; a card number
/// is refused as such, wherever it is put, and never repeated in the answer.
async fn bad_payout_requests_are_400_and_leave_the_key_free(backend: Backend) {
    let app = spawn_app(backend).await;
    app.charged(10_000, "tok_visa").await;
    let with = |field: &str, value: Value| {
        let mut body = payout(100);
        body[field] = value;
        body
    };
    let cases = [
        (with("ammount", json!(100)), "invalid_request"),
        (with("amount", json!(0)), "invalid_request"),
        (with("amount", json!("100")), "invalid_request"),
        (with("currency", json!("xyz")), "invalid_request"),
        (
            json!({ "amount": 100, "currency": "usd" }),
            "invalid_request",
        ),
        (with("destination", json!("tok_visa")), "invalid_request"),
        (with("destination", json!("ba_")), "invalid_request"),
        (json!([]), "invalid_request"),
        (
            with("destination", json!("4242424242424242")),
            "card_number_not_allowed",
        ),
        (
            with("destination", json!("ba_4242424242424242")),
            "card_number_not_allowed",
        ),
        (
            with("description", json!("to card 4242 4242 4242 4242")),
            "card_number_not_allowed",
        ),
    ];
    let mut keys = Vec::new();
    for (body, code) in &cases {
        let key = new_key();
        let (status, answer) = problem(app.post_payout(ACME, &key, body).await).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some(*code)),
            "{body}"
        );
        let digits = answer.to_string().replace([' ', '-'], "");
        assert!(
            !digits.contains("4242424242424242"),
            "the answer repeats the number: {answer}"
        );
        keys.push(key);
    }
    let missing = app
        .client
        .post(app.url("/payouts"))
        .bearer_auth(ACME)
        .json(&payout(100))
        .send()
        .await
        .expect("send");
    let (status, answer) = problem(missing).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (400, Some("idempotency_key_missing"))
    );
    assert_eq!(
        count_rows(app.db(), "idempotency_records").await,
        1,
        "only the charge's key"
    );
    assert_eq!(count_rows(app.db(), "payouts").await, 0);

    // None of the keys was consumed: a valid payout under each is made, not replayed.
    for key in &keys {
        let response = app.post_payout(ACME, key, &payout(100)).await;
        assert_eq!(response.status().as_u16(), 201);
        assert!(response.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(
        paid_payouts(&app).await,
        (keys.len() as i64, 100 * keys.len() as i64)
    );
}

/// On PostgreSQL, concurrent payouts' finishes share a transaction and a commit: a batch
/// writes each of its payouts once, so that the processor, the paid payout rows, their ledger
/// transactions and events, and the tenant's balance all count every payout exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_payouts_finished_in_one_batch_are_each_written_once() {
    const CHARGED: i64 = 16_000;
    let (card_sim, app) = with_card_sim(Backend::Postgres).await;
    app.charged(CHARGED, "tok_visa").await;
    let body = payout(100);
    let (app, body) = (&app, &body);
    let payouts = concurrent_until_finished_in_a_batch(app, "payouts.create", |key| async move {
        app.post_payout(ACME, &key, body).await
    })
    .await;

    assert_eq!(card_sim.payouts_created().await, payouts);
    assert_eq!(paid_payouts(app).await, (payouts, payouts * 100));
    assert_eq!(payout_transactions(app).await, payouts);
    let events: HashSet<String> = paid_events(app).await.into_iter().collect();
    assert_eq!(events.len() as i64, payouts);
    assert_eq!(count_rows(app.db(), "outbox_events").await, 1 + payouts);
    assert_eq!(
        balance(app, ACME).await,
        available_usd(CHARGED - payouts * 100)
    );
    assert_ledger_balances(app).await;
}

on_every_backend!(
    a_payout_and_its_replay_are_byte_identical_and_another_amount_under_the_key_is_422,
    a_payout_over_the_available_balance_is_400_insufficient_balance_and_replays,
    a_declined_payout_replays_its_402_and_releases_its_reservation,
    another_tenants_payout_is_404,
    concurrent_payouts_and_refunds_never_take_the_balance_below_zero,
    bad_payout_requests_are_400_and_leave_the_key_free,
);
