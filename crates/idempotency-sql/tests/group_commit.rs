//! Group commits: concurrent writers share one commit, and each still gets its own verdict.
//!
//! On SQLite the claims and the records' transactions of concurrent writers share one
//! transaction. Each test stages one batch exactly: the test holds the write gate with a write
//! of its own while the writers queue behind it (it waits until the gate counts them all
//! waiting), then commits: the gate lets them in one at a time, in the order they queued, and
//! each leaves its work in the batch the first of them began.
//!
//! On PostgreSQL concurrent claims share one statement, which reads the records of the keys
//! that exist as it inserts the fresh ones. A transaction of the test's holds an uncommitted
//! row under the key `holder`, and a claim of that key waits on it inside the first statement;
//! the claims queued meanwhile (the test waits until the store counts them all waiting) are the
//! next statement's, in the order they queued.

mod check;
mod common;
mod holders;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use payments_idempotency::engine::{
    Begin, Claim, Completion, End, Engine, Fence, Idempotent, KeyedRequest, Owner, ProtocolError,
    RecordStore,
};
use payments_idempotency::{Fingerprint, IdempotencyKey, RecordState, Scope};
use payments_idempotency_sql::{Backend, GroupCommits, PgRecords, PoolSettings, SqlRecords};
use serde_json::json;
use sqlx::PgConnection;
use tokio::sync::watch;

use check::{Check, TABLES, response};
use holders::{connection, until_statements_wait_on_holders};

fn scope() -> Scope {
    Scope {
        tenant: "acme".to_owned(),
        operation: "checks.create".to_owned(),
    }
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::parse(name).unwrap_or_else(|e| panic!("{e}"))
}

fn fingerprint(amount: u64) -> Fingerprint {
    Fingerprint::of_json_request("POST", "/checks", &json!({ "amount": amount }))
}

fn commits(records: &SqlRecords) -> GroupCommits {
    records.group_commits()
}

/// Waits until `writers` writers wait at the gate, or claims for a statement (bounded: a
/// writer that never comes fails the test).
async fn until_waiting(records: &SqlRecords, writers: usize) {
    for _ in 0..1_000 {
        if commits(records).waiting >= writers {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "{} writers wait at the gate, not {writers}",
        commits(records).waiting
    );
}

async fn claim(records: &SqlRecords, name: &str, amount: u64) -> Claim {
    records
        .claim(&scope(), &key(name), &fingerprint(amount), b"{}")
        .await
        .unwrap_or_else(|e| panic!("claim {name}: {e}"))
}

async fn owned(records: &SqlRecords, name: &str, amount: u64) -> Fence {
    match claim(records, name, amount).await {
        Claim::Owned(claimed) => claimed.fence(),
        other => panic!("{name} should be claimed, got {other:?}"),
    }
}

/// Ends `name`'s record in a transaction begun over it under `fence`, if the fence holds.
async fn end_record(records: &SqlRecords, name: &str, fence: Fence) -> Option<Completion> {
    let (scope, key) = (scope(), key(name));
    let owner = Owner::new(&scope, &key, fence);
    let mut transaction = records
        .begin(owner, Begin::HOLDING)
        .await
        .unwrap_or_else(|e| panic!("begin {name}: {e}"))?;
    let stored = response(&json!({ "ended": name }));
    let completion = records
        .end(&mut transaction, owner, End::Made(&stored))
        .await
        .unwrap_or_else(|e| panic!("end {name}: {e}"));
    records
        .commit(transaction)
        .await
        .unwrap_or_else(|e| panic!("commit {name}: {e}"));
    Some(completion)
}

fn ended(completion: Option<Completion>) -> String {
    match completion {
        None => "fenced off",
        Some(Completion::Stored { .. }) => "stored",
        Some(Completion::Fenced) => "fenced at its end",
    }
    .to_owned()
}

/// The writers' verdicts, in the order they were spawned.
async fn verdicts(writers: Vec<tokio::task::JoinHandle<String>>) -> Vec<String> {
    let mut verdicts = Vec::new();
    for writer in writers {
        verdicts.push(writer.await.unwrap_or_else(|e| panic!("{e}")));
    }
    verdicts
}

/// Runs `writers` in one batch: each queues at the gate, in order, behind a write of the
/// test's, which then commits and lets them in one at a time. Their verdicts, in that order.
async fn in_one_batch<W>(records: &SqlRecords, writers: impl IntoIterator<Item = W>) -> Vec<String>
where
    W: Future<Output = String> + Send + 'static,
{
    let holder = records
        .begin_write()
        .await
        .unwrap_or_else(|e| panic!("hold the gate: {e}"));
    let mut queued = Vec::new();
    for (position, writer) in writers.into_iter().enumerate() {
        queued.push(tokio::spawn(writer));
        until_waiting(records, position + 1).await;
    }
    holder
        .commit()
        .await
        .unwrap_or_else(|e| panic!("commit the holder: {e}"));
    verdicts(queued).await
}

async fn state(records: &SqlRecords, name: &str) -> Option<(RecordState, i32)> {
    records
        .find_record(&scope(), &key(name))
        .await
        .unwrap_or_else(|e| panic!("read {name}: {e}"))
        .map(|(record, _)| (record.state, record.attempts.0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_holds_fresh_claims_a_duplicate_a_mismatch_and_a_fenced_off_record() {
    let fresh = common::on(Backend::Sqlite).await;
    let records = Arc::new(fresh.records.clone());
    let ending = owned(&records, "ending", 1).await;
    let stale = Fence {
        generation: uuid::Uuid::new_v4(),
        ..ending
    };

    let before = commits(&records);
    // In this order: the duplicate and the mismatch meet the first claim of `fresh-1` in the
    // batch, uncommitted; the fenced-off transaction sits between writers that write, and
    // undoing its work must undo nothing of `fresh-2`'s just before it.
    let queue: [(&str, u64); 7] = [
        ("fresh-1", 1),
        ("fresh-2", 1),
        ("fenced", 0),
        ("fresh-1", 1),
        ("fresh-1", 2),
        ("ending", 0),
        ("fresh-3", 1),
    ];
    let writers = queue.map(|(name, amount)| {
        let writer = Arc::clone(&records);
        async move {
            match name {
                "fenced" => ended(end_record(&writer, "ending", stale).await),
                "ending" => ended(end_record(&writer, "ending", ending).await),
                _ => match claim(&writer, name, amount).await {
                    Claim::Owned(_) => "owned".to_owned(),
                    Claim::InFlight { .. } => "in flight".to_owned(),
                    other => format!("{other:?}"),
                },
            }
        }
    });
    let verdicts = in_one_batch(&records, writers).await;

    assert_eq!(
        verdicts,
        [
            "owned",
            "owned",
            "fenced off",
            "in flight",
            "Mismatch",
            "stored",
            "owned"
        ],
        "the verdicts, in the order the writers queued"
    );
    let after = commits(&records);
    assert_eq!(
        (after.commits - before.commits, after.writes - before.writes),
        (2, 7),
        "the holder's commit, then one commit of the six writers that wrote (the fenced-off \
         one wrote nothing)"
    );
    for name in ["fresh-1", "fresh-2", "fresh-3"] {
        assert_eq!(state(&records, name).await, Some((RecordState::Pending, 1)));
    }
    assert_eq!(
        state(&records, "ending").await,
        Some((RecordState::Completed, 1)),
        "the record ended by its owner, not touched by the fenced-off transaction"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_commit_is_written_again_one_writer_at_a_time() {
    let fresh = common::on(Backend::Sqlite).await;
    let SqlRecords::Sqlite(sqlite) = &fresh.records else {
        panic!("an SQLite store");
    };
    for sql in TABLES {
        sqlx::query(sql)
            .execute(sqlite.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let records = fresh.records.clone();
    let (go, waiting_to_go) = watch::channel(false);
    let op = Arc::new(Idempotent::new(Check::new(waiting_to_go)));
    let engine = Arc::new(Engine::new(Arc::new(records.clone())));

    // Four requests whose rows are good, and one whose parent does not exist.
    let parents = ["present", "present", "absent", "present", "present"];
    let mut requests = Vec::new();
    for (n, parent) in parents.into_iter().enumerate() {
        let (engine, op) = (Arc::clone(&engine), Arc::clone(&op));
        requests.push(tokio::spawn(async move {
            let key = key(&format!("check-{n}"));
            let request =
                KeyedRequest::of::<Check>("acme".to_owned(), key, parent.to_owned(), None);
            engine.run(&op, request).await
        }));
    }
    for _ in 0..1_000 {
        if op.arrived.load(Ordering::SeqCst) == parents.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(op.arrived.load(Ordering::SeqCst), parents.len());

    // Every finish queues behind the holder, and all five go into one batch.
    let holder = records
        .begin_write()
        .await
        .unwrap_or_else(|e| panic!("hold the gate: {e}"));
    let before = commits(&records);
    go.send_replace(true);
    until_waiting(&records, parents.len()).await;
    holder
        .commit()
        .await
        .unwrap_or_else(|e| panic!("commit the holder: {e}"));
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap_or_else(|e| panic!("{e}")));
    }

    let statuses: Vec<_> = answers
        .iter()
        .map(|answer| match answer {
            Ok(answer) => answer.response.status,
            Err(ProtocolError::Store(_)) => 503,
            Err(other) => panic!("{other}"),
        })
        .collect();
    assert_eq!(
        statuses,
        [201, 201, 503, 201, 201],
        "only the request with the bad row fails"
    );
    let after = commits(&records);
    assert_eq!(
        after.failed - before.failed,
        2,
        "the batch of five failed once, and the bad row again alone"
    );
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM checks")
        .fetch_one(sqlite.pool())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rows, 4, "one row for each request that succeeded");
    for (n, parent) in parents.into_iter().enumerate() {
        let (record, _) = records
            .find_record(&scope(), &key(&format!("check-{n}")))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("check-{n} has a record"));
        let expected = if parent == "present" {
            (RecordState::Completed, None)
        } else {
            // Left for a retry, with the effect it made: never failed, never made again.
            (
                RecordState::Pending,
                Some(format!("effect-{}", record.effect_key)),
            )
        };
        assert_eq!((record.state, record.effect_id.clone()), expected);
    }
}

/// Waits until `writes` writes are left in the open batch, waiting for its commit (bounded).
async fn until_left(records: &SqlRecords, writes: usize) {
    for _ in 0..1_000 {
        if commits(records).left == writes {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "{} writes are left in the open batch, not {writes}",
        commits(records).left
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_writers_all_went_away_is_still_committed() {
    let fresh = common::on(Backend::Sqlite).await;
    let SqlRecords::Sqlite(sqlite) = &fresh.records else {
        panic!("an SQLite store");
    };
    let records = Arc::new(fresh.records.clone());
    let holder = records
        .begin_write()
        .await
        .unwrap_or_else(|e| panic!("hold the gate: {e}"));
    let mut claims = Vec::new();
    for (position, name) in ["gone-1", "gone-2"].into_iter().enumerate() {
        let writer = Arc::clone(&records);
        claims.push(tokio::spawn(async move { claim(&writer, name, 1).await }));
        until_waiting(&records, position + 1).await;
    }
    // A writer that queues behind them and is then not polled: once they are through, the gate
    // is kept for it, and whatever commits their batch has to wait behind it.
    let mut stalled = Box::pin(records.begin_write());
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut stalled)
            .await
            .is_err(),
        "the gate is held"
    );
    until_waiting(&records, 3).await;
    holder
        .commit()
        .await
        .unwrap_or_else(|e| panic!("commit the holder: {e}"));

    // Both claims are in the open batch, waiting for its commit; then their clients go away.
    until_left(&records, 2).await;
    for claim in claims {
        claim.abort();
        assert!(claim.await.is_err_and(|e| e.is_cancelled()));
    }
    drop(stalled);

    until_left(&records, 0).await;
    for name in ["gone-1", "gone-2"] {
        assert_eq!(
            state(&records, name).await,
            Some((RecordState::Pending, 1)),
            "{name}'s claim was committed with its batch"
        );
    }
    // The batch's transaction has ended: a write from outside the gate (another process's)
    // gets the write lock.
    sqlx::query("UPDATE idempotency_records SET updated_at = updated_at")
        .execute(sqlite.pool())
        .await
        .unwrap_or_else(|e| panic!("a write outside the gate: {e}"));
}

/// A writer that joins others' work sets its savepoint in the same round trip as its first
/// statement. When that statement fails, whether the savepoint was set is not known, and
/// rolling back to `member` could undo the writer before it: the batch is given up, and the
/// writers whose claims were in it make them again, alone. Here a trigger of the test's refuses
/// the insert of one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_first_statement_fails_gives_its_batch_up_and_the_others_claim_again_alone()
{
    let fresh = common::on(Backend::Sqlite).await;
    let SqlRecords::Sqlite(sqlite) = &fresh.records else {
        panic!("an SQLite store");
    };
    sqlx::query(
        "CREATE TRIGGER refuse BEFORE INSERT ON idempotency_records
         WHEN NEW.idempotency_key = 'refused'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .execute(sqlite.pool())
    .await
    .unwrap_or_else(|e| panic!("create the trigger: {e}"));
    let records = Arc::new(fresh.records.clone());

    let before = commits(&records);
    let writers = ["fresh-1", "fresh-2", "refused", "fresh-3"].map(|name| {
        let writer = Arc::clone(&records);
        async move { claim_verdict(&writer, name, 1).await }
    });
    let verdicts = in_one_batch(&records, writers).await;

    assert_eq!(verdicts[..2], ["owned", "owned"]);
    assert!(
        verdicts[2].contains("refused by the test"),
        "the refused claim fails with its own error, got {:?}",
        verdicts[2]
    );
    assert_eq!(verdicts[3], "owned");
    let after = commits(&records);
    assert_eq!(
        (after.commits - before.commits, after.writes - before.writes),
        (4, 4),
        "the holder's commit; the batch of fresh-1 and fresh-2 given up, not committed; \
         fresh-3's batch; fresh-1 and fresh-2 again, each alone"
    );
    for name in ["fresh-1", "fresh-2", "fresh-3"] {
        assert_eq!(state(&records, name).await, Some((RecordState::Pending, 1)));
    }
    assert_eq!(state(&records, "refused").await, None);
}

/// A claim's verdict, in words; an error with its causes (`Debug`: the store's `Display` names
/// only itself).
async fn claim_verdict(records: &SqlRecords, name: &str, amount: u64) -> String {
    match records
        .claim(&scope(), &key(name), &fingerprint(amount), b"{}")
        .await
    {
        Ok(Claim::Owned(_)) => "owned".to_owned(),
        Ok(Claim::InFlight { .. }) => "in flight".to_owned(),
        Ok(Claim::Replay { response, .. }) => {
            format!("replay of {}", String::from_utf8_lossy(&response.body))
        }
        Ok(other) => format!("{other:?}"),
        Err(error) => format!("error: {error:?}"),
    }
}

/// Runs `queue`'s claims in one statement, behind the holder's, and returns their verdicts in
/// the order they queued, with the store's statements before the holder's and after all.
async fn in_one_statement(
    records: &Arc<SqlRecords>,
    queue: &[(&'static str, u64)],
) -> (Vec<String>, GroupCommits, GroupCommits) {
    let holder = hold(records, "holder").await;
    let before = records.group_commits();
    let behind_holder = {
        let records = Arc::clone(records);
        tokio::spawn(async move { claim_verdict(&records, "holder", 1).await })
    };
    until_statements_wait_on_holders(records, 1).await;
    let mut claims = Vec::new();
    for (position, &(name, amount)) in queue.iter().enumerate() {
        let queued = Arc::clone(records);
        claims.push(tokio::spawn(async move {
            claim_verdict(&queued, name, amount).await
        }));
        until_waiting(records, position + 1).await;
    }
    let_go(holder).await;
    assert_eq!(
        behind_holder.await.unwrap_or_else(|e| panic!("{e}")),
        "owned",
        "the claim the holder held back, once the holder's row is gone"
    );
    let verdicts = verdicts(claims).await;
    (verdicts, before, records.group_commits())
}

/// A transaction of the test's holding an uncommitted record under `key`: a claim of the key
/// waits on it inside its statement until [`let_go`].
async fn hold(records: &SqlRecords, key: &str) -> PgConnection {
    let mut holder = connection(records).await;
    sqlx::query("BEGIN")
        .execute(&mut holder)
        .await
        .unwrap_or_else(|e| panic!("begin: {e}"));
    sqlx::query(
        "INSERT INTO idempotency_records
             (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point,
              locked_until, attempts, resource_id, processor_key, expires_at)
         VALUES ('acme', 'checks.create', $1, sha256($1::bytea), 'pending', 'started',
                 now(), 1, gen_random_uuid(), 'effect_' || $1, now())",
    )
    .bind(key)
    .execute(&mut holder)
    .await
    .unwrap_or_else(|e| panic!("hold {key}: {e}"));
    holder
}

/// Rolls the holder's record back: the claim waiting on it inserts its own.
async fn let_go(mut holder: PgConnection) {
    sqlx::query("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap_or_else(|e| panic!("let the key go: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_holds_fresh_claims_a_duplicate_and_a_mismatch() {
    let fresh = common::on(Backend::Postgres).await;
    let records = Arc::new(fresh.records.clone());

    // The duplicate and the mismatch meet the first claim of `fresh-1` in the same statement.
    let (verdicts, before, after) = in_one_statement(
        &records,
        &[
            ("fresh-1", 1),
            ("fresh-2", 1),
            ("fresh-1", 1),
            ("fresh-1", 2),
            ("fresh-3", 1),
        ],
    )
    .await;

    assert_eq!(
        verdicts,
        ["owned", "owned", "in flight", "Mismatch", "owned"],
        "the verdicts, in the order the claims queued"
    );
    assert_eq!(
        (after.commits - before.commits, after.writes - before.writes),
        (2, 6),
        "the holder's statement, then one statement of the five claims"
    );
    for name in ["holder", "fresh-1", "fresh-2", "fresh-3"] {
        assert_eq!(
            state(&records, name).await,
            Some((RecordState::Pending, 1)),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_answers_the_keys_that_exist_from_their_records_beside_fresh_claims() {
    let fresh = common::on(Backend::Postgres).await;
    let records = Arc::new(fresh.records.clone());
    // Before the statement: a completed record, a pending one its attempt still holds, and a
    // pending one whose attempt's lock has run out.
    let done = owned(&records, "done", 1).await;
    assert_eq!(ended(end_record(&records, "done", done).await), "stored");
    owned(&records, "held", 1).await;
    owned(&records, "stale", 1).await;
    sqlx::query(
        "UPDATE idempotency_records SET locked_until = now() - interval '1 hour'
         WHERE idempotency_key = 'stale'",
    )
    .execute(&mut connection(&records).await)
    .await
    .unwrap_or_else(|e| panic!("let stale's lock run out: {e}"));

    // A transaction of the test's holds the row locks of `done` and `held` meanwhile: a retry
    // judged under the lock would wait for it, one answered from the statement's read does not.
    let mut locker = connection(&records).await;
    sqlx::query("BEGIN")
        .execute(&mut locker)
        .await
        .unwrap_or_else(|e| panic!("begin: {e}"));
    sqlx::query(
        "SELECT 1 FROM idempotency_records WHERE idempotency_key IN ('done', 'held') FOR UPDATE",
    )
    .fetch_all(&mut locker)
    .await
    .unwrap_or_else(|e| panic!("lock done and held: {e}"));

    // Every claim goes into the statement, the retries too: none reads its record first.
    let claims = in_one_statement(
        &records,
        &[
            ("fresh-1", 1),
            ("done", 1),
            ("held", 1),
            ("done", 2),
            ("stale", 1),
            ("fresh-2", 1),
        ],
    );
    let (verdicts, before, after) = tokio::time::timeout(Duration::from_secs(10), claims)
        .await
        .unwrap_or_else(|_| panic!("a retry waited for its record's lock"));
    drop(locker);

    assert_eq!(
        verdicts,
        [
            "owned",
            r#"replay of {"ended":"done"}"#,
            "in flight",
            "Mismatch",
            "owned",
            "owned"
        ],
        "the verdicts, in the order the claims queued: the retries answered from the records \
         the statement read, the stale record taken over under the lock"
    );
    assert_eq!(
        (after.commits - before.commits, after.writes - before.writes),
        (2, 7),
        "the holder's statement, then one statement of the six claims"
    );
    for (name, expected) in [
        ("done", (RecordState::Completed, 1)),
        ("held", (RecordState::Pending, 1)),
        ("stale", (RecordState::Pending, 2)),
        ("fresh-1", (RecordState::Pending, 1)),
        ("fresh-2", (RecordState::Pending, 1)),
    ] {
        assert_eq!(state(&records, name).await, Some(expected), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_statement_is_written_again_claim_by_claim() {
    let fresh = common::on(Backend::Postgres).await;
    let records = Arc::new(fresh.records.clone());
    // A row the database refuses: one claim's key breaks a constraint of the test's.
    sqlx::query(
        "ALTER TABLE idempotency_records
         ADD CONSTRAINT no_refused_key CHECK (idempotency_key <> 'refused')",
    )
    .execute(&mut connection(&records).await)
    .await
    .unwrap_or_else(|e| panic!("add the constraint: {e}"));

    let (verdicts, before, after) =
        in_one_statement(&records, &[("good-1", 1), ("refused", 1), ("good-2", 1)]).await;

    assert_eq!(verdicts[0], "owned");
    assert!(
        verdicts[1].starts_with("error: "),
        "the refused claim fails alone: {}",
        verdicts[1]
    );
    assert_eq!(verdicts[2], "owned");
    assert_eq!(
        (after.commits - before.commits, after.failed - before.failed),
        (1, 1),
        "the holder's statement, then the three claims' statement, refused"
    );
    assert_eq!(
        state(&records, "good-1").await,
        Some((RecordState::Pending, 1))
    );
    assert_eq!(state(&records, "refused").await, None);
    assert_eq!(
        state(&records, "good-2").await,
        Some((RecordState::Pending, 1))
    );
}

/// The backend of the one statement that waits for a row lock in the records' database
/// (bounded).
async fn backend_waiting_on_a_holder(records: &SqlRecords) -> i32 {
    let mut watcher = connection(records).await;
    for _ in 0..1_000 {
        let waiting: Vec<(i32,)> = sqlx::query_as(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_all(&mut watcher)
        .await
        .unwrap_or_else(|e| panic!("pg_stat_activity: {e}"));
        if let [(pid,)] = waiting[..] {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no statement waits on a holder's row");
}

/// Taken by the tests that watch which connection a statement goes on: the process distrusts
/// its connections all at once, and one of them has it do so.
static WATCHING_CONNECTIONS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Two claims' statements written back to back by one writer: the second claim queues while
/// the first statement waits on a holder's row, and waits on a row of its own. `between` runs
/// while the first statement waits. Returns the backends the two statements ran on.
async fn two_statements_in_a_row(records: &Arc<SqlRecords>, between: impl FnOnce()) -> (i32, i32) {
    let first_holder = hold(records, "held-1").await;
    let second_holder = hold(records, "held-2").await;
    let first = {
        let records = Arc::clone(records);
        tokio::spawn(async move { claim_verdict(&records, "held-1", 1).await })
    };
    let first_backend = backend_waiting_on_a_holder(records).await;
    let second = {
        let records = Arc::clone(records);
        tokio::spawn(async move { claim_verdict(&records, "held-2", 1).await })
    };
    until_waiting(records, 1).await;
    between();
    let_go(first_holder).await;
    assert_eq!(first.await.unwrap_or_else(|e| panic!("{e}")), "owned");
    let second_backend = backend_waiting_on_a_holder(records).await;
    let_go(second_holder).await;
    assert_eq!(second.await.unwrap_or_else(|e| panic!("{e}")), "owned");
    (first_backend, second_backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_keeps_its_connection_from_one_statement_to_the_next_and_then_gives_it_back() {
    let _turn = WATCHING_CONNECTIONS.lock().await;
    let fresh = common::on(Backend::Postgres).await;
    let records = Arc::new(fresh.records.clone());

    let (first, second) = two_statements_in_a_row(&records, || ()).await;

    assert_eq!(
        first, second,
        "the second statement went on the first one's connection"
    );
    let SqlRecords::Postgres(postgres) = &*records else {
        panic!("PostgreSQL's records");
    };
    let pool = postgres.pool();
    for _ in 0..1_000 {
        // Given back: idle in the pool, or closed by it.
        if pool.num_idle() == pool.size() as usize {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "the queue is empty and the writer still holds its connection: {} of {} idle",
        pool.num_idle(),
        pool.size()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_gives_its_connection_back_once_the_process_distrusts_its_connections() {
    let _turn = WATCHING_CONNECTIONS.lock().await;
    let fresh = common::on(Backend::Postgres).await;
    let records = Arc::new(fresh.records.clone());

    // As after a statement that found its node demoted, or that got no answer.
    let (first, second) = two_statements_in_a_row(
        &records,
        payments_idempotency_sql::postgres::distrust_open_connections,
    )
    .await;

    assert_ne!(
        first, second,
        "the statement after the distrust went on a connection of its own"
    );
}

/// The pool settings of the stores these tests make beside the suite's own.
fn pool_settings(lock_timeout: Duration) -> PoolSettings {
    PoolSettings {
        max_connections: 8,
        acquire_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(30),
        lock_timeout,
        idle_in_transaction_timeout: Duration::from_secs(60),
    }
}

/// A second instance on the same database: a record store with a claim queue of its own.
fn another_instance(records: &SqlRecords) -> SqlRecords {
    let SqlRecords::Postgres(records) = records else {
        panic!("PostgreSQL's records");
    };
    SqlRecords::Postgres(PgRecords::new(
        records.pool().clone(),
        &pool_settings(Duration::from_secs(30)),
        records.policy(),
    ))
}

/// Queues `names`' claims on `records` behind a statement held back by the key `gate` (the
/// `waiting`th statement then waiting on a holder; the store counting the claims waiting),
/// and returns them with the gate's holder.
async fn queue_behind(
    records: &Arc<SqlRecords>,
    gate: &'static str,
    waiting: i64,
    names: [&'static str; 3],
) -> (PgConnection, Vec<tokio::task::JoinHandle<String>>) {
    let holder = hold(records, gate).await;
    let mut claims = Vec::new();
    let gated = Arc::clone(records);
    claims.push(tokio::spawn(
        async move { claim_verdict(&gated, gate, 1).await },
    ));
    until_statements_wait_on_holders(records, waiting).await;
    for (position, name) in names.into_iter().enumerate() {
        let queued = Arc::clone(records);
        claims.push(tokio::spawn(async move {
            claim_verdict(&queued, name, 1).await
        }));
        until_waiting(records, position + 1).await;
    }
    (holder, claims)
}

/// Two instances' statements hold some of the same keys, queued in opposite orders, and are
/// on their way at once. Each statement takes its keys in key order, so the second waits for
/// the first and never the other way round as well: no deadlock (which PostgreSQL would end
/// after `deadlock_timeout` by failing one statement, its claims then written alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_claiming_the_same_keys_in_opposite_orders_never_deadlock() {
    let fresh = common::on(Backend::Postgres).await;
    let one = Arc::new(fresh.records.clone());
    let two = Arc::new(another_instance(&fresh.records));
    // Each instance's statement of three claims is held back by a gate, and each holds a key
    // of its own (`z-one`, `z-two`) that a holder keeps it waiting on once it has begun.
    let z_one = hold(&one, "z-one").await;
    let z_two = hold(&two, "z-two").await;
    let (gate_one, mut claims) = queue_behind(&one, "gate-one", 1, ["a", "z-one", "b"]).await;
    let (gate_two, claims_two) = queue_behind(&two, "gate-two", 2, ["b", "z-two", "a"]).await;
    claims.extend(claims_two);

    // Instance one's statement begins and stops at `z-one`; then instance two's begins.
    let_go(gate_one).await;
    until_statements_wait_on_holders(&one, 2).await;
    let_go(gate_two).await;
    until_statements_wait_on_holders(&one, 2).await;
    let_go(z_one).await;
    let_go(z_two).await;
    let verdicts = verdicts(claims).await;

    assert_eq!(
        verdicts,
        [
            "owned",
            "owned",
            "owned",
            "owned",
            "owned",
            "in flight",
            "owned",
            "in flight"
        ],
        "instance one's gate, a, z-one and b; instance two's gate, b, z-two and a"
    );
    assert_eq!(
        (commits(&one).failed, commits(&two).failed),
        (0, 0),
        "no statement failed (a deadlock fails one of the two)"
    );
}

/// A store on the records' database whose connections wait at most `lock_timeout` for a row
/// another transaction holds.
fn waiting_at_most(records: &SqlRecords, lock_timeout: Duration) -> SqlRecords {
    let SqlRecords::Postgres(records) = records else {
        panic!("PostgreSQL's records");
    };
    let settings = pool_settings(lock_timeout);
    let options = records.pool().connect_options().as_ref().clone();
    SqlRecords::Postgres(PgRecords::new(
        payments_idempotency_sql::postgres::connect_lazy(options, &settings),
        &settings,
        records.policy(),
    ))
}

/// A record held by a transaction that does not end (an instance frozen between a finish's
/// completion and its commit) holds up no claim of another key: the statement its key's retry
/// shares with other tenants' fresh claims only reads it, inserts the others and fails nothing;
/// the retry, whose record's lock has ended, waits for the row under the lock at most the
/// store's `lock_timeout`, and is answered as in flight, as it would be while the lock lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_held_by_a_transaction_holds_up_only_its_own_claim() {
    let fresh = common::on(Backend::Postgres).await;
    let records = Arc::new(waiting_at_most(&fresh.records, Duration::from_millis(300)));
    owned(&records, "held", 1).await;
    let mut frozen = connection(&records).await;
    for statement in [
        // Its lock ended: a retry would take it over, under the row's lock.
        "UPDATE idempotency_records SET locked_until = now() - interval '1 minute'",
        "BEGIN",
        "UPDATE idempotency_records SET updated_at = now() WHERE idempotency_key = 'held'",
    ] {
        sqlx::query(statement)
            .execute(&mut frozen)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    let before = records.group_commits();
    let (gate, claims) = queue_behind(&records, "gate", 1, ["fresh-a", "held", "fresh-b"]).await;
    let_go(gate).await;
    let verdicts = verdicts(claims).await;
    let after = records.group_commits();

    assert_eq!(
        verdicts,
        ["owned", "owned", "in flight", "owned"],
        "the gate, fresh-a, the held key's retry and fresh-b, while the row is still held"
    );
    assert_eq!(
        (
            after.commits - before.commits,
            after.writes - before.writes,
            after.failed - before.failed
        ),
        (2, 4, 0),
        "the gate's statement, then one of the three claims, which failed nothing"
    );
    for name in ["fresh-a", "fresh-b"] {
        assert_eq!(
            state(&records, name).await,
            Some((RecordState::Pending, 1)),
            "{name}"
        );
    }
    sqlx::query("ROLLBACK")
        .execute(&mut frozen)
        .await
        .unwrap_or_else(|e| panic!("rollback: {e}"));
    assert_eq!(
        claim_verdict(&records, "held", 1).await,
        "owned",
        "the retry takes the record over once its row is let go"
    );
}
