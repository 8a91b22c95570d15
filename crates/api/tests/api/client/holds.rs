//! Holds from the command line, against the real service and card-sim, through the faulty
//! proxy: `payments charge --no-capture` authorises, `payments capture` takes what it is told
//! and `payments cancel` releases, each once however many of its answers are lost, resumed
//! under its key from its journal, and counted at the processor and in the balance.

use serde_json::Value;

use super::{Fault, FaultProxy, ids, journaled_key, key_of, payments, payments_within, run};
use crate::card_sim::CardSim;
use crate::helpers::{Backend, with_card_sim};

on_every_backend!(
    a_hold_made_on_the_command_line_is_captured_once_through_a_faulty_network,
    a_cancel_killed_by_its_deadline_resumes_from_its_journal_and_voids_once,
);

/// What the processor made: authorisations, captures and voids.
async fn processor(card_sim: &CardSim) -> (i64, i64, i64) {
    (
        card_sim.authorizations_created().await,
        card_sim.captures_created().await,
        card_sim.voids_created().await,
    )
}

/// `payments charge --no-capture` of `amount`: a hold, as the command line prints it.
async fn hold(proxy: &FaultProxy, amount: &str) -> Value {
    let args = [
        "charge",
        "--amount",
        amount,
        "--currency",
        "usd",
        "--source",
        "tok_visa",
        "--no-capture",
    ];
    let (code, held, stderr) = run(&mut payments(&proxy.url, &args)).await;
    assert_eq!(code, 0, "{stderr}");
    held
}

/// `payments balance`, in USD: available, pending and authorized (absent when none).
async fn balance(proxy: &FaultProxy) -> (i64, i64, i64) {
    let (code, balance, stderr) = run(&mut payments(&proxy.url, &["balance"])).await;
    assert_eq!(code, 0, "{stderr}");
    let usd = |part: &str| {
        let amounts = balance.get(part).and_then(Value::as_array);
        amounts
            .into_iter()
            .flatten()
            .filter(|amount| amount["currency"] == "USD")
            .map(|amount| amount["amount"].as_i64().expect("an amount"))
            .sum::<i64>()
    };
    (usd("available"), usd("pending"), usd("authorized"))
}

/// The problem a command printed on stderr, and its exit code.
fn problem_code(code: i32, stderr: &str) -> (i32, String) {
    let problem: Value =
        serde_json::from_str(stderr).unwrap_or_else(|_| panic!("the problem on stderr: {stderr}"));
    let name = problem["code"].as_str().expect("a code").to_owned();
    (code, name)
}

async fn a_hold_made_on_the_command_line_is_captured_once_through_a_faulty_network(
    backend: Backend,
) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let held = hold(&proxy, "5000").await;
    let id = held["id"].as_str().expect("a charge id").to_owned();
    assert_eq!(held["status"], "requires_capture", "{held}");
    assert_eq!(
        (&held["captured"], &held["amount_capturable"]),
        (&Value::from(false), &Value::from(5_000)),
        "{held}"
    );
    assert_eq!(held["amount_captured"], 0, "{held}");
    assert!(held["capture_before"].is_string(), "{held}");
    assert_eq!(processor(&card_sim).await, (1, 0, 0));
    assert_eq!(balance(&proxy).await, (0, 0, 5_000), "held, not available");
    proxy.take_answers();

    // Its answer lost twice and its connection reset: captured once, for what it was told.
    proxy.script(&[Fault::LoseAnswer, Fault::LoseAnswer, Fault::Reset]);
    let capture = ["capture", id.as_str(), "--amount", "2000"];
    let (code, captured, stderr) = run(&mut payments(&proxy.url, &capture)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("replayed by the service"), "{stderr}");
    assert_eq!(captured["id"], id.as_str());
    assert_eq!(captured["status"], "succeeded", "{captured}");
    assert_eq!(
        (
            &captured["captured"],
            &captured["amount_captured"],
            &captured["amount_capturable"]
        ),
        (&Value::from(true), &Value::from(2_000), &Value::from(0)),
        "{captured}"
    );
    assert_eq!(ids(&proxy.take_answers()), [id.as_str(); 3]);
    assert_eq!(processor(&card_sim).await, (1, 1, 0));
    assert!(proxy.script_done());

    // The key is the capture's, and what it captured is the tenant's; the rest is released.
    let key = key_of(&stderr);
    let asked = ["key", key.as_str(), "--operation", "charges.capture"];
    let (code, record, stderr) = run(&mut payments(&proxy.url, &asked)).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (&record["operation"], &record["state"]),
        (&Value::from("charges.capture"), &Value::from("completed")),
        "{record}"
    );
    assert_eq!(balance(&proxy).await, (2_000, 0, 0));

    // Under a new key, a second capture is refused for good, and nothing moves.
    let (code, _, stderr) = run(&mut payments(&proxy.url, &["capture", &id])).await;
    assert_eq!(
        problem_code(code, &stderr),
        (1, "charge_already_captured".to_owned())
    );
    assert_eq!(processor(&card_sim).await, (1, 1, 0));
    assert_eq!(
        card_sim.charges_created().await,
        1,
        "the hold, and no charge"
    );
    assert_eq!(balance(&proxy).await, (2_000, 0, 0));
}

async fn a_cancel_killed_by_its_deadline_resumes_from_its_journal_and_voids_once(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let held = hold(&proxy, "3000").await;
    let id = held["id"].as_str().expect("a charge id").to_owned();
    assert_eq!(balance(&proxy).await, (0, 0, 3_000));

    // A reason no caller gives is a usage error, and nothing is sent.
    proxy.take_answers();
    let expired = ["cancel", id.as_str(), "--reason", "expired"];
    let (code, _, stderr) = run(&mut payments(&proxy.url, &expired)).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("one of duplicate, fraudulent, requested_by_customer, abandoned"),
        "{stderr}"
    );
    assert!(proxy.take_answers().is_empty(), "nothing sent");

    // Every answer lost until its deadline: the processor voids, the run exits 3, and the
    // journal keeps the key without an answer.
    let dir = std::env::temp_dir().join(format!("payments-journal-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("journal dir");
    let journal = dir.join("journal");
    let journal_arg = journal.to_str().expect("a UTF-8 path");
    let cancel = [
        "cancel",
        id.as_str(),
        "--reason",
        "abandoned",
        "--journal",
        journal_arg,
    ];
    proxy.script(&[Fault::LoseAnswer; 100]);
    let (code, stdout, stderr) = run(&mut payments_within(&proxy.url, &cancel, "2")).await;
    proxy.pass_everything();
    assert_eq!(code, 3, "no answer came: {stderr}");
    assert_eq!(stdout, Value::Null);
    let key = journaled_key(&journal).await;
    assert!(stderr.contains(&key), "{stderr}");
    let lost = proxy.take_answers();
    assert!(!lost.is_empty());
    assert_eq!(ids(&lost), vec![id.as_str(); lost.len()], "{lost:?}");
    assert_eq!(processor(&card_sim).await, (1, 0, 1));

    // The same command again: the same key, the first run's cancel replayed.
    let (code, canceled, stderr) = run(&mut payments(&proxy.url, &cancel)).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(key_of(&stderr), key, "resumed under the journaled key");
    assert!(stderr.contains("replayed by the service"), "{stderr}");
    assert_eq!(canceled["id"], id.as_str());
    assert_eq!(canceled["status"], "canceled", "{canceled}");
    assert_eq!(canceled["cancellation_reason"], "abandoned", "{canceled}");
    assert_eq!(
        (
            &canceled["captured"],
            &canceled["amount_capturable"],
            &canceled["amount_captured"]
        ),
        (&Value::from(false), &Value::from(0), &Value::from(0)),
        "{canceled}"
    );
    assert_eq!(canceled, lost[0], "the answer the first run lost");

    // And once more: from the journal, nothing sent.
    let (code, again, stderr) = run(&mut payments(&proxy.url, &cancel)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("from the journal"), "{stderr}");
    assert_eq!(again, canceled);
    assert_eq!(proxy.take_answers().len(), 1, "only the resumed run sent");

    // Released: nothing held, nothing available, and a capture now is refused for good.
    assert_eq!(balance(&proxy).await, (0, 0, 0));
    let (code, _, stderr) = run(&mut payments(&proxy.url, &["capture", &id])).await;
    assert_eq!(
        problem_code(code, &stderr),
        (1, "charge_canceled".to_owned())
    );
    assert_eq!(processor(&card_sim).await, (1, 0, 1));
    std::fs::remove_dir_all(dir).expect("clean up");
}
