//! Finishes in batches on PostgreSQL: the finishes of an operation's concurrent requests share
//! one transaction and one commit, each record fenced on its own, and a batch that fails is
//! written again one finish at a time.
//!
//! Each test stages one batch exactly. The first request's finish is written alone, and a
//! transaction of the test's holds that request's record, so that its completion waits on it.
//! The other requests' finishes queue meanwhile (the test waits until the operation has made
//! all their rows, which it does just before queueing each). When the test lets the record
//! go, the first finish commits and the others are written as one batch.

mod check;
mod common;
mod holders;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use payments_idempotency::engine::{
    Answer, Idempotent, KeyedRequest, Observer, ProtocolError, RecordStore,
};
use payments_idempotency::{IdempotencyKey, RecordState, Scope};
use payments_idempotency_sql::{Backend, SqlRecords};
use sqlx::PgConnection;
use tokio::sync::watch;

use check::{Check, TABLES};
use holders::{connection, until_statements_wait_on_holders};

/// The sizes of the batches of finishes written, in order.
#[derive(Debug, Default)]
struct Batches(Mutex<Vec<usize>>);

#[async_trait]
impl Observer for Batches {
    fn finishes_written(&self, _: &'static str, finishes: usize) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(finishes);
    }
}

fn key(n: usize) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("check-{n}")).unwrap_or_else(|e| panic!("{e}"))
}

fn scope() -> Scope {
    Scope {
        tenant: "acme".to_owned(),
        operation: "checks.create".to_owned(),
    }
}

async fn execute(connection: &mut PgConnection, sql: &str) {
    sqlx::query(sql)
        .execute(&mut *connection)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Waits until `check` holds (bounded: a finish that never comes fails the test).
async fn until(what: &str, check: impl Fn() -> bool) {
    for _ in 0..1_000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never: {what}");
}

/// What the staged requests came to, and what the database holds after them.
struct Staged {
    answers: Vec<Result<Answer, ProtocolError>>,
    batches: Vec<usize>,
    records: SqlRecords,
    _fresh: common::Fresh,
}

/// Runs one request per parent: the first finishes alone while the test holds its record, and
/// the others queue and are written as one batch. `meanwhile` runs on a connection of the
/// test's while they wait, just before the first is let go.
async fn stage(parents: &[&'static str], meanwhile: &str) -> Staged {
    let fresh = common::on(Backend::Postgres).await;
    let records = fresh.records.clone();
    let mut test = connection(&records).await;
    for sql in TABLES {
        execute(&mut test, sql).await;
    }
    let (go, waiting_to_go) = watch::channel(false);
    let op = Arc::new(Idempotent::finishing_in_batches(Check::new(waiting_to_go)));
    let batches = Arc::new(Batches::default());
    let engine = Arc::new(records.engine().with_observer(Arc::clone(&batches) as _));
    let spawn = |n: usize, parent: &'static str| {
        let (engine, op) = (Arc::clone(&engine), Arc::clone(&op));
        tokio::spawn(async move {
            let request =
                KeyedRequest::of::<Check>("acme".to_owned(), key(n), parent.to_owned(), None);
            engine.run(&op, request).await
        })
    };

    // The first request is claimed and at its effect; the test holds its record.
    let first = spawn(0, parents[0]);
    until("the first request is at its effect", || {
        op.arrived.load(Ordering::SeqCst) == 1
    })
    .await;
    let mut holder = connection(&records).await;
    execute(&mut holder, "BEGIN").await;
    execute(
        &mut holder,
        "SELECT 1 FROM idempotency_records WHERE idempotency_key = 'check-0' FOR UPDATE",
    )
    .await;
    go.send_replace(true);
    until_statements_wait_on_holders(&records, 1).await;

    let mut requests = vec![first];
    for (n, parent) in parents.iter().enumerate().skip(1) {
        requests.push(spawn(n, parent));
    }
    until("every finish has queued", || {
        op.rows_made.load(Ordering::SeqCst) == parents.len()
    })
    .await;
    if !meanwhile.is_empty() {
        execute(&mut test, meanwhile).await;
    }
    execute(&mut holder, "ROLLBACK").await;

    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap_or_else(|e| panic!("{e}")));
    }
    let batches = batches.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Staged {
        answers,
        batches,
        records,
        _fresh: fresh,
    }
}

fn statuses(answers: &[Result<Answer, ProtocolError>]) -> Vec<String> {
    answers
        .iter()
        .map(|answer| match answer {
            Ok(answer) => answer.response.status.to_string(),
            Err(error) => format!("{error:?}"),
        })
        .collect()
}

async fn checks(records: &SqlRecords) -> Vec<String> {
    let mut connection = connection(records).await;
    sqlx::query_scalar("SELECT effect_id FROM checks ORDER BY effect_id")
        .fetch_all(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("read the checks: {e}"))
}

/// Each record's state, attempts and effect id, in the requests' order.
async fn states(records: &SqlRecords, n: usize) -> Vec<(RecordState, i32, Option<String>)> {
    let mut states = Vec::new();
    for n in 0..n {
        let (record, _) = records
            .find_record(&scope(), &key(n))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("check-{n} has a record"));
        states.push((record.state, record.attempts.0, record.effect_id));
    }
    states
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_of_finishes_completes_its_records_beside_one_another_attempt_took_over() {
    // check-2's record is taken over while its finish waits in the queue: its attempt no
    // longer owns it.
    let took_over = "UPDATE idempotency_records SET attempts = attempts + 1
                     WHERE idempotency_key = 'check-2'";
    let staged = stage(&["present"; 5], took_over).await;

    assert_eq!(
        staged.batches,
        [1, 4],
        "the first finish alone, then the four that queued behind it in one batch"
    );
    let statuses = statuses(&staged.answers);
    assert_eq!(statuses[..2], ["201", "201"]);
    assert!(
        statuses[2].starts_with("KeyInUse"),
        "the fenced-off finish answers from the record, pending under the attempt that took \
         it over: {}",
        statuses[2]
    );
    assert_eq!(statuses[3..], ["201", "201"]);
    let states: Vec<_> = states(&staged.records, 5)
        .await
        .into_iter()
        .map(|(state, attempts, _)| (state, attempts))
        .collect();
    assert_eq!(
        states,
        [
            (RecordState::Completed, 1),
            (RecordState::Completed, 1),
            (RecordState::Pending, 2),
            (RecordState::Completed, 1),
            (RecordState::Completed, 1),
        ]
    );
    let checks = checks(&staged.records).await;
    assert_eq!(
        checks.len(),
        4,
        "one row for each record completed, none for the fenced-off finish: {checks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_finishes_whose_commit_fails_is_written_again_one_finish_at_a_time() {
    let parents = ["present", "present", "absent", "present", "present"];
    let staged = stage(&parents, "").await;

    assert_eq!(
        staged.batches,
        [1, 4],
        "the first finish alone, then the four that queued behind it in one batch (which \
         failed: the finishes written again alone are no batch)"
    );
    let statuses = statuses(&staged.answers);
    assert_eq!(statuses[..2], ["201", "201"]);
    assert!(
        statuses[2].starts_with("Store"),
        "only the request with the bad row fails: {}",
        statuses[2]
    );
    assert_eq!(statuses[3..], ["201", "201"]);
    let states: Vec<_> = states(&staged.records, 5)
        .await
        .into_iter()
        .map(|(state, _, effect_id)| (state, effect_id.is_some()))
        .collect();
    assert_eq!(
        states,
        [
            (RecordState::Completed, false),
            (RecordState::Completed, false),
            // Left for a retry, with the effect it made: never failed, never made again.
            (RecordState::Pending, true),
            (RecordState::Completed, false),
            (RecordState::Completed, false),
        ]
    );
    assert_eq!(
        checks(&staged.records).await.len(),
        4,
        "one row for each request that succeeded"
    );
}
