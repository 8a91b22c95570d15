//! Authorise now, capture later (`"capture": false`, `charges.capture`, `charges.cancel`), with
//! the real card simulator: a hold's money is never the tenant's until it is captured, one
//! capture or one cancel ends a hold however many keys race for it, a retried capture captures
//! once, and a hold past its `capture_before` is canceled once, whatever captures meet it.
//! Every count is the processor's, the ledger's and the outbox's.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::Response;
use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::helpers::{
    ACME, Backend, TestApp, assert_ledger_balances, count_rows, new_key, payout, problem, snapshot,
    spawn_app_with,
};

/// What the processor, the ledger and the outbox hold: authorisations, captures and voids at
/// the processor; ledger transactions; `payment.authorized`, `payment.completed` and
/// `payment.canceled` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    authorizations: i64,
    captures: i64,
    voids: i64,
    ledger_transactions: i64,
    authorized_events: i64,
    completed_events: i64,
    canceled_events: i64,
}

async fn counts(card_sim: &CardSim, app: &TestApp) -> Counts {
    Counts {
        authorizations: card_sim.authorizations_created().await,
        captures: card_sim.captures_created().await,
        voids: card_sim.voids_created().await,
        ledger_transactions: count_rows(app.db(), "ledger_transactions").await,
        authorized_events: events_of(app, "payment.authorized").await,
        completed_events: events_of(app, "payment.completed").await,
        canceled_events: events_of(app, "payment.canceled").await,
    }
}

async fn events_of(app: &TestApp, event_type: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM outbox_events WHERE event_type = '{event_type}'"
    ))
    .fetch_one(app.db())
    .await
    .expect("count events")
}

/// The service with the card simulator, and `env`.
async fn with_card_sim_and(backend: Backend, env: &[(&str, &str)]) -> (CardSim, TestApp) {
    let card_sim = CardSim::start().await;
    let mut env = env.to_vec();
    env.push(("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()));
    let app = spawn_app_with(backend, &env).await;
    (card_sim, app)
}

/// Authorises `amount` with `token` and returns the hold as the 201 shows it.
async fn hold(app: &TestApp, amount: i64, token: &str) -> Value {
    let body = json!({ "amount": amount, "currency": "usd", "source": token, "capture": false });
    let response = app.post_charge(ACME, &new_key(), &body).await;
    assert_eq!(response.status().as_u16(), 201);
    response.json().await.expect("charge JSON")
}

fn id_of(charge: &Value) -> String {
    charge["id"].as_str().expect("charge id").to_owned()
}

async fn post(
    app: &TestApp,
    client: &reqwest::Client,
    path: &str,
    key: &str,
    body: &Value,
) -> reqwest::Result<Response> {
    client
        .post(app.url(path))
        .bearer_auth(ACME)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
}

async fn capture(app: &TestApp, charge: &str, key: &str, body: &Value) -> Response {
    post(
        app,
        &app.client,
        &format!("/charges/{charge}/capture"),
        key,
        body,
    )
    .await
    .expect("POST /charges/{id}/capture")
}

async fn cancel(app: &TestApp, charge: &str, key: &str, body: &Value) -> Response {
    post(
        app,
        &app.client,
        &format!("/charges/{charge}/cancel"),
        key,
        body,
    )
    .await
    .expect("POST /charges/{id}/cancel")
}

/// The tenant's balance as `GET /balance` shows it in USD: available, pending, authorized.
async fn balance(app: &TestApp) -> (i64, i64, i64) {
    let balance: Value = app.get_json(ACME, "/balance").await;
    // `authorized` is absent when the tenant holds nothing.
    let usd = |part: &str| {
        balance
            .get(part)
            .map(|amounts| amounts.as_array().expect("an array of amounts"))
            .into_iter()
            .flatten()
            .filter(|a| a["currency"] == "USD")
            .map(|a| a["amount"].as_i64().expect("amount"))
            .sum::<i64>()
    };
    (usd("available"), usd("pending"), usd("authorized"))
}

async fn code_of(response: Response) -> (u16, String) {
    let (status, problem) = problem(response).await;
    (status, problem["code"].as_str().expect("code").to_owned())
}

async fn a_hold_is_captured_once_and_the_balance_is_exact_at_each_step(backend: Backend) {
    let (card_sim, app) = with_card_sim_and(backend, &[]).await;
    let held = hold(&app, 5_000, "tok_visa").await;
    let charge = id_of(&held);
    assert_eq!(held["status"], "requires_capture", "{held}");
    assert_eq!(held["captured"], false);
    assert_eq!(held["amount_capturable"], 5_000);
    assert_eq!(held["amount_captured"], 0);
    assert!(held["capture_before"].is_string(), "{held}");
    let after_hold = counts(&card_sim, &app).await;
    assert_eq!(
        (after_hold.authorizations, after_hold.ledger_transactions),
        (1, 0),
        "a hold is authorised and posts nothing"
    );
    assert_eq!(after_hold.authorized_events, 1);
    assert_eq!(balance(&app).await, (0, 0, 5_000));
    // A build that knew no holds, reserving a refund on it, is refused by the schema itself.
    let reserved = sqlx::query(&format!(
        "UPDATE charges SET amount_reserved = 100 WHERE id = {}",
        app.database.uuid_param("$1")
    ))
    .bind(charge.trim_start_matches("ch_"))
    .execute(app.db())
    .await;
    assert!(reserved.is_err(), "a reservation on held money is refused");

    // Held money is no one's yet: nothing of it can be refunded or paid out.
    let refund = app
        .post_refund(ACME, &charge, &new_key(), &json!({ "amount": 100 }))
        .await;
    assert_eq!(code_of(refund).await, (400, "charge_not_captured".into()));
    let paid_out = app.post_payout(ACME, &new_key(), &payout(100)).await;
    assert_eq!(
        code_of(paid_out).await,
        (400, "insufficient_balance".into())
    );
    assert_eq!(card_sim.refunds_created().await, 0);
    assert_eq!(card_sim.payouts_created().await, 0);

    // A part is captured; the rest of the hold is released.
    let key = new_key();
    let body = json!({ "amount_to_capture": 3_000 });
    let first = capture(&app, &charge, &key, &body).await;
    let (status, _, bytes) = snapshot(first, &[]).await;
    assert_eq!(status, 200);
    let captured: Value = serde_json::from_slice(&bytes).expect("charge JSON");
    assert_eq!(captured["status"], "succeeded", "{captured}");
    assert_eq!(captured["captured"], true);
    assert_eq!(captured["amount_captured"], 3_000);
    assert_eq!(captured["amount_capturable"], 0);
    let (status, headers, replayed) = snapshot(
        capture(&app, &charge, &key, &body).await,
        &["idempotent-replayed"],
    )
    .await;
    assert_eq!(
        (status, replayed),
        (200, bytes),
        "the replay is the same bytes"
    );
    assert_eq!(headers[0].as_deref(), Some("true"));
    assert_eq!(balance(&app).await, (3_000, 0, 0));

    // A second capture, and a cancel, of a captured hold: refused, and nothing moves.
    let again = capture(&app, &charge, &new_key(), &json!({})).await;
    assert_eq!(
        code_of(again).await,
        (400, "charge_already_captured".into())
    );
    let canceled = cancel(&app, &charge, &new_key(), &json!({})).await;
    assert_eq!(
        code_of(canceled).await,
        (400, "charge_already_captured".into())
    );
    let after_capture = counts(&card_sim, &app).await;
    assert_eq!(
        after_capture,
        Counts {
            captures: 1,
            ledger_transactions: 1,
            completed_events: 1,
            ..after_hold
        }
    );
    let completed: Value = sqlx::query_scalar::<_, String>(
        "SELECT CAST(payload AS TEXT) FROM outbox_events WHERE event_type = 'payment.completed'",
    )
    .fetch_one(app.db())
    .await
    .map(|payload| serde_json::from_str(&payload).expect("payload JSON"))
    .expect("the completed event");
    assert_eq!(completed["amount"], 3_000, "{completed}");

    // Refunds draw on what was captured, never on what was held.
    let too_much = app
        .post_refund(ACME, &charge, &new_key(), &json!({ "amount": 3_001 }))
        .await;
    assert_eq!(
        code_of(too_much).await,
        (400, "refund_amount_too_large".into())
    );
    let refund = app
        .post_refund(ACME, &charge, &new_key(), &json!({ "amount": 3_000 }))
        .await;
    assert_eq!(refund.status().as_u16(), 201);
    assert_eq!(balance(&app).await, (0, 0, 0));
    assert_eq!(card_sim.refunds_created().await, 1);
    assert_ledger_balances(&app).await;
}

async fn a_capture_above_the_hold_or_of_a_charge_captured_at_once_changes_nothing(
    backend: Backend,
) {
    let (card_sim, app) = with_card_sim_and(backend, &[]).await;
    // `"capture": null` is neither: refused before the claim, the key left free.
    let key = new_key();
    let null = json!({ "amount": 5_000, "currency": "usd", "source": "tok_visa", "capture": null });
    let refused = app.post_charge(ACME, &key, &null).await;
    assert_eq!(code_of(refused).await, (400, "invalid_request".into()));
    app.assert_key_is_free(&key).await;
    let charge = id_of(&hold(&app, 5_000, "tok_visa").await);
    let too_much = capture(
        &app,
        &charge,
        &new_key(),
        &json!({ "amount_to_capture": 5_001 }),
    )
    .await;
    let (status, problem) = problem(too_much).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (400, Some("amount_too_large"))
    );
    assert_eq!(problem["amount_capturable"], 5_000, "{problem}");
    let shown: Value = app.get_json(ACME, &format!("/charges/{charge}")).await;
    assert_eq!(shown["status"], "requires_capture", "{shown}");
    assert_eq!(card_sim.captures_created().await, 0);

    // The refusal left no claim behind: a capture of all of it under a new key goes through.
    let all = capture(&app, &charge, &new_key(), &json!({})).await;
    assert_eq!(all.status().as_u16(), 200);
    let captured: Value = all.json().await.expect("charge JSON");
    assert_eq!(captured["amount_captured"], 5_000);

    // A charge captured when it was made has nothing to capture, nor to cancel; its view is
    // what it was before holds existed.
    let at_once = app.charged(700, "tok_visa").await;
    let shown: Value = app.get_json(ACME, &format!("/charges/{at_once}")).await;
    for field in [
        "captured",
        "amount_capturable",
        "amount_captured",
        "capture_before",
    ] {
        assert!(shown.get(field).is_none(), "{field} in {shown}");
    }
    let nothing = capture(&app, &at_once, &new_key(), &json!({})).await;
    assert_eq!(
        code_of(nothing).await,
        (400, "charge_already_captured".into())
    );
    let nothing = cancel(&app, &at_once, &new_key(), &json!({})).await;
    assert_eq!(
        code_of(nothing).await,
        (400, "charge_already_captured".into())
    );
    assert_eq!(card_sim.captures_created().await, 1);
    assert_eq!(card_sim.voids_created().await, 0);
    assert_eq!(card_sim.authorizations_created().await, 1);
}

/// The processor takes 2 s for every call on a `tok_slow` hold, and the service gives up on it
/// after 1 s: the service loses the processor's answer, and the client loses the service's,
/// three times (each retry waiting on the attempt in flight, for less than it takes). Retries
/// under the same key then go on until one is answered: one capture, one answer.
async fn a_capture_whose_answer_is_lost_again_and_again_captures_once(backend: Backend) {
    let env = [
        ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "1000"),
        ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "60000"),
    ];
    let (card_sim, app) = with_card_sim_and(backend, &env).await;
    // The hold takes as long: its first answers are 503 too.
    let hold_key = new_key();
    let body =
        json!({ "amount": 4_000, "currency": "usd", "source": "tok_slow", "capture": false });
    let (status, bytes) = until_answered(|| app.post_charge(ACME, &hold_key, &body)).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&bytes));
    let charge = id_of(&serde_json::from_slice(&bytes).expect("charge JSON"));
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("a client");
    let key = new_key();
    let path = format!("/charges/{charge}/capture");
    let body = json!({});
    let send = |client: &reqwest::Client| {
        client
            .post(app.url(&path))
            .bearer_auth(ACME)
            .header("Idempotency-Key", &key)
            .header("Prefer", "wait=10")
            .json(&body)
            .send()
    };
    for _ in 0..3 {
        let lost = send(&impatient).await;
        assert!(lost.is_err(), "the answer is lost: the client gave up");
    }
    let (status, bytes) =
        until_answered(|| async { send(&app.client).await.expect("a retry") }).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let (status, _, again) = snapshot(capture(&app, &charge, &key, &body).await, &[]).await;
    assert_eq!((status, &again), (200, &bytes), "one answer");
    let after = counts(&card_sim, &app).await;
    assert_eq!(
        (
            after.captures,
            after.ledger_transactions,
            after.completed_events
        ),
        (1, 1, 1)
    );
}

/// Sends `send` until its answer is not a 503 (an unknown outcome, the service's own timeout
/// at the processor: retried under the same key), for at most 20 s; its status and body.
async fn until_answered<Sent>(send: impl Fn() -> Sent) -> (u16, Vec<u8>)
where
    Sent: std::future::Future<Output = Response>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, bytes) = snapshot(send().await, &[]).await;
        if status != 503 || Instant::now() > deadline {
            return (status, bytes);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A capture and a cancel under different keys, sent together at one hold, fifty times.
async fn a_capture_and_a_cancel_raced_end_each_hold_once(backend: Backend) {
    const ROUNDS: usize = 50;
    let (card_sim, app) = with_card_sim_and(backend, &[]).await;
    let mut captured = 0;
    for round in 0..ROUNDS {
        let charge = id_of(&hold(&app, 1_000, "tok_visa").await);
        let (capture_key, cancel_key) = (new_key(), new_key());
        let (everything, abandoned) = (json!({}), json!({ "cancellation_reason": "abandoned" }));
        let (by_capture, by_cancel) = tokio::join!(
            capture(&app, &charge, &capture_key, &everything),
            cancel(&app, &charge, &cancel_key, &abandoned),
        );
        let (capture_status, cancel_status) =
            (by_capture.status().as_u16(), by_cancel.status().as_u16());
        let shown: Value = app.get_json(ACME, &format!("/charges/{charge}")).await;
        match (capture_status, cancel_status) {
            (200, 400) => {
                captured += 1;
                let (_, code) = code_of(by_cancel).await;
                assert_eq!(code, "charge_already_captured", "round {round}");
                assert_eq!(shown["status"], "succeeded", "round {round}: {shown}");
            }
            (400, 200) => {
                let (_, code) = code_of(by_capture).await;
                assert_eq!(code, "charge_canceled", "round {round}");
                assert_eq!(shown["status"], "canceled", "round {round}: {shown}");
                assert_eq!(shown["cancellation_reason"], "abandoned");
            }
            other => panic!("round {round}: exactly one ends the hold, not {other:?}"),
        }
    }
    let after = counts(&card_sim, &app).await;
    let canceled = ROUNDS as i64 - captured;
    assert_eq!(
        after,
        Counts {
            authorizations: ROUNDS as i64,
            captures: captured,
            voids: canceled,
            ledger_transactions: captured,
            authorized_events: ROUNDS as i64,
            completed_events: captured,
            canceled_events: canceled,
        }
    );
    assert_eq!(balance(&app).await, (1_000 * captured, 0, 0));
}

/// Holds last one second here; the expiry worker looks every 100 ms.
const SHORT_HOLDS: [(&str, &str); 2] = [
    ("PAYMENTS__PROCESSOR__AUTHORIZATION_WINDOW_SECS", "1"),
    ("PAYMENTS__WORKERS__HOLD_EXPIRY_INTERVAL_MS", "100"),
];

/// Waits until no hold of the tenant is still `requires_capture`, for at most `within`.
async fn until_no_hold_is_left(app: &TestApp, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM charges WHERE capture_status = 'requires_capture'",
        )
        .fetch_one(app.db())
        .await
        .expect("count holds");
        if left == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{left} holds still held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_hold_past_its_capture_before_is_canceled_once_and_never_captured(backend: Backend) {
    let (card_sim, app) = with_card_sim_and(backend, &SHORT_HOLDS).await;
    let charge = id_of(&hold(&app, 2_500, "tok_visa").await);
    // A client took the key the expiry would cancel this hold under, for a cancel of another
    // hold of its own: the expiry cancels this one all the same.
    let other = id_of(&hold(&app, 100, "tok_visa").await);
    let taken = cancel(&app, &other, &format!("hold-expiry-{charge}"), &json!({})).await;
    assert_eq!(taken.status().as_u16(), 200);
    until_no_hold_is_left(&app, Duration::from_secs(10)).await;
    let shown: Value = app.get_json(ACME, &format!("/charges/{charge}")).await;
    assert_eq!(shown["status"], "canceled", "{shown}");
    assert_eq!(shown["cancellation_reason"], "expired");
    let late = capture(&app, &charge, &new_key(), &json!({})).await;
    let (status, code) = code_of(late).await;
    assert_eq!((status, code.as_str()), (400, "charge_expired_for_capture"));
    // Rounds of the worker after the expiry find nothing more to do.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = counts(&card_sim, &app).await;
    assert_eq!(
        (
            after.captures,
            after.voids,
            after.canceled_events,
            after.ledger_transactions
        ),
        (0, 2, 2, 0),
        "the client's cancel and the expiry's"
    );
    assert_eq!(balance(&app).await, (0, 0, 0));
}

/// Twenty holds, each met by a capture sent around its `capture_before`, while the expiry
/// worker cancels what it finds past it: each hold ends once, by one or the other.
async fn the_expiry_and_late_captures_raced_end_each_hold_once(backend: Backend) {
    const HOLDS: usize = 20;
    let (card_sim, app) = with_card_sim_and(backend, &SHORT_HOLDS).await;
    let mut holds = Vec::new();
    for _ in 0..HOLDS {
        holds.push(id_of(&hold(&app, 300, "tok_visa").await));
    }
    // The captures go out from just before the first hold's deadline to past the last's.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let captures = holds.iter().enumerate().map(|(n, charge)| {
        let app = &app;
        async move {
            tokio::time::sleep(Duration::from_millis(20 * n as u64)).await;
            capture(app, charge, &new_key(), &json!({})).await
        }
    });
    let answers = join_all(captures).await;
    until_no_hold_is_left(&app, Duration::from_secs(10)).await;
    let mut captured = 0;
    for (charge, answer) in holds.iter().zip(answers) {
        let shown: Value = app.get_json(ACME, &format!("/charges/{charge}")).await;
        if answer.status().as_u16() == 200 {
            captured += 1;
            assert_eq!(shown["status"], "succeeded", "{shown}");
        } else {
            let (status, code) = code_of(answer).await;
            assert_eq!(status, 400);
            assert!(
                ["charge_expired_for_capture", "charge_canceled"].contains(&code.as_str()),
                "{code}"
            );
            assert_eq!(shown["status"], "canceled", "{shown}");
            assert_eq!(shown["cancellation_reason"], "expired");
        }
    }
    let after = counts(&card_sim, &app).await;
    let expired = HOLDS as i64 - captured;
    assert_eq!(
        (after.captures, after.voids, after.ledger_transactions),
        (captured, expired, captured)
    );
    assert_eq!(
        (after.completed_events, after.canceled_events),
        (captured, expired)
    );
}

/// A day with a charge, a hold captured in part, one canceled and one expired reconciles with
/// the processor's report without an exception: the report lists each authorisation as the
/// books list its hold, by its whole amount, and each capture and void as the books list what
/// ended the hold (what the capture took, what the void released).
async fn a_day_of_holds_reconciles_without_an_exception(backend: Backend) {
    let (card_sim, app) = with_card_sim_and(backend, &SHORT_HOLDS).await;
    app.charged(1_000, "tok_visa").await;
    let captured = id_of(&hold(&app, 2_000, "tok_visa").await);
    let canceled = id_of(&hold(&app, 3_000, "tok_visa").await);
    let part = json!({ "amount_to_capture": 1_500 });
    let capture = capture(&app, &captured, &new_key(), &part).await;
    assert_eq!(capture.status().as_u16(), 200);
    let cancel = cancel(&app, &canceled, &new_key(), &json!({})).await;
    assert_eq!(cancel.status().as_u16(), 200);
    hold(&app, 4_000, "tok_visa").await;
    until_no_hold_is_left(&app, Duration::from_secs(10)).await;

    let (status, run) = crate::reconciliation::reconcile(&app.database, &card_sim).await;
    assert_eq!(status, 0, "{run}");
    // A charge, three authorisations, one capture and two voids.
    assert_eq!(run["counts"]["matched"], 7, "{run}");
    assert_eq!(run["exceptions"], 0);
    let after = counts(&card_sim, &app).await;
    assert_eq!((after.captures, after.voids), (1, 2));
}

/// A capture and a void made at the processor that the service never asked for are one
/// `processor_only` exception each, of their own type; a capture the service made that the
/// report leaves out is one `books_only`. Everything else of the day matches.
async fn each_capture_or_void_the_books_miss_is_one_exception(backend: Backend) {
    let (card_sim, app) = with_card_sim_and(backend, &[]).await;
    let captured = hold(&app, 2_000, "tok_visa").await;
    let voided = hold(&app, 3_000, "tok_visa").await;
    let ours = id_of(&hold(&app, 4_000, "tok_visa").await);
    let processor_id = |charge: &Value| charge["processor_charge_id"].as_str().map(str::to_owned);
    let (Some(captured), Some(voided)) = (processor_id(&captured), processor_id(&voided)) else {
        panic!("a hold without its processor_charge_id");
    };
    let unasked_capture = card_sim.capture_unasked(&captured, &new_key(), 1_200).await;
    let unasked_void = card_sim.void_unasked(&voided, &new_key()).await;
    let answer = capture(&app, &ours, &new_key(), &json!({})).await;
    assert_eq!(answer.status().as_u16(), 200);
    let our_capture: String = sqlx::query_scalar(
        "SELECT processor_capture_id FROM charges WHERE processor_capture_id IS NOT NULL",
    )
    .fetch_one(app.db())
    .await
    .expect("the capture's processor id");
    card_sim.drop_from_report(&our_capture).await;

    let (status, run) = crate::reconciliation::reconcile(&app.database, &card_sim).await;
    assert_ne!(status, 0, "{run}");
    let mut found: Vec<(String, String, String)> = run["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            let text = |field: &str| item[field].as_str().unwrap_or_default().to_owned();
            (text("result"), text("type"), text("processor_id"))
        })
        .collect();
    found.sort();
    let mut expected = vec![
        ("books_only".to_owned(), "capture".to_owned(), our_capture),
        (
            "processor_only".to_owned(),
            "capture".to_owned(),
            unasked_capture,
        ),
        ("processor_only".to_owned(), "void".to_owned(), unasked_void),
    ];
    expected.sort();
    assert_eq!(found, expected, "{run}");
    assert_eq!(run["exceptions"], 3, "{run}");
    // Three authorisations.
    assert_eq!(run["counts"]["matched"], 3, "{run}");
    assert_eq!(
        count_rows(app.db(), "reconciliation_exceptions").await,
        3,
        "each kept once"
    );
}

on_every_backend!(
    a_day_of_holds_reconciles_without_an_exception,
    each_capture_or_void_the_books_miss_is_one_exception,
    a_hold_is_captured_once_and_the_balance_is_exact_at_each_step,
    a_capture_above_the_hold_or_of_a_charge_captured_at_once_changes_nothing,
    a_capture_whose_answer_is_lost_again_and_again_captures_once,
    a_capture_and_a_cancel_raced_end_each_hold_once,
    a_hold_past_its_capture_before_is_canceled_once_and_never_captured,
    the_expiry_and_late_captures_raced_end_each_hold_once,
);
