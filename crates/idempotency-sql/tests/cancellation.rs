//! Callers dropped half-way. A service that awaits the store in a request's own future is
//! cancelled wherever it stands when its client hangs up: in a claim, in the middle of a
//! transaction's `BEGIN`, between its statements, in its commit. Whatever each dropped call
//! left behind, it must not be a connection stuck in a transaction that nothing will end:
//! afterwards every claim and every ended record is committed, and seen from another
//! connection.

mod common;

use std::time::Duration;

use common::on;
use futures::future::join_all;
use payments_idempotency::engine::{Begin, Claim, End, Owner, RecordStore, StoreFailure};
use payments_idempotency::{Fingerprint, IdempotencyKey, SchemaVersion, Scope, StoredResponse};
use payments_idempotency_sql::{Backend, SqlRecords, Transaction};
use sqlx::Connection as _;

fn scope() -> Scope {
    Scope {
        tenant: "acme".to_owned(),
        operation: "checks.create".to_owned(),
    }
}

/// A fresh key's claim, its record's transaction, the record ended in it and committed: what
/// a request that makes its effect at once asks of the store.
async fn claim_and_end(records: &SqlRecords, name: &str) {
    let (scope, key) = (
        scope(),
        IdempotencyKey::parse(name).unwrap_or_else(|e| panic!("{e}")),
    );
    let fingerprint = Fingerprint::of_json_request("POST", "/checks", &serde_json::json!({}));
    let claimed = match records.claim(&scope, &key, &fingerprint, b"{}").await {
        Ok(Claim::Owned(claimed)) => claimed,
        other => panic!("{name} should be claimed, got {other:?}"),
    };
    let owner = Owner::new(&scope, &key, claimed.fence());
    // A caller dropped while the first statement of its transaction ran may or may not have
    // set its savepoint, and its SQLite batch is then given up: the others' commits fail with
    // `BatchFailed`, having written nothing, and each does its transaction again alone, as the
    // engine does.
    let shared = records.begin(owner, Begin::HOLDING).await;
    if let Err(failure) = end_record(records, owner, shared).await {
        assert!(failure.is_batch_failed(), "{name}: {failure}");
        let alone = records.begin(owner, Begin::HOLDING.alone()).await;
        end_record(records, owner, alone)
            .await
            .unwrap_or_else(|e| panic!("{name}, alone: {e}"));
    }
}

/// The record ended in `begun`, the transaction begun over it, and committed.
async fn end_record(
    records: &SqlRecords,
    owner: Owner<'_>,
    begun: Result<Option<Transaction>, StoreFailure>,
) -> Result<(), StoreFailure> {
    let mut transaction = begun?.expect("the record is fenced off");
    let response = StoredResponse::new(
        SchemaVersion::new(1),
        201,
        [("content-type", "application/json")],
        b"{}".to_vec(),
    );
    records
        .end(&mut transaction, owner, End::Made(&response))
        .await?;
    records.commit(transaction).await
}

/// How many of `keys` are completed, read on a connection of its own, outside the store's pool.
async fn completed_elsewhere(records: &SqlRecords, keys: &[String]) -> usize {
    let sql = "SELECT state FROM idempotency_records WHERE idempotency_key = $1";
    let mut completed = 0;
    for key in keys {
        let state: Option<String> = match records {
            SqlRecords::Postgres(postgres) => {
                let options = postgres.pool().connect_options();
                let mut connection = sqlx::PgConnection::connect_with(&options)
                    .await
                    .expect("connect");
                sqlx::query_scalar(sql)
                    .bind(key)
                    .fetch_optional(&mut connection)
                    .await
            }
            SqlRecords::Sqlite(sqlite) => {
                let options = sqlite.pool().connect_options();
                let mut connection = sqlx::SqliteConnection::connect_with(&options)
                    .await
                    .expect("open");
                sqlx::query_scalar(sql)
                    .bind(key)
                    .fetch_optional(&mut connection)
                    .await
            }
        }
        .expect("read the record");
        completed += usize::from(state.as_deref() == Some("completed"));
    }
    completed
}

/// On PostgreSQL, every connection of the pool at once: each statement on each must be a
/// transaction of its own. On a connection a dropped caller left inside a transaction, two
/// statements share that transaction's id. (A SQLite connection left so holds the write lock,
/// and the claims that follow wait for it in vain.)
async fn no_connection_is_inside_a_transaction(records: &SqlRecords) {
    let SqlRecords::Postgres(postgres) = records else {
        return;
    };
    let pool = postgres.pool();
    let connections = join_all((0..8).map(|_| pool.acquire())).await;
    for connection in connections {
        let mut connection = connection.expect("a connection of the pool");
        let mut transaction_id = async || -> i64 {
            sqlx::query_scalar("SELECT txid_current()")
                .fetch_one(&mut *connection)
                .await
                .expect("ask the connection")
        };
        let (first, second) = (transaction_id().await, transaction_id().await);
        assert_ne!(
            first, second,
            "a connection of the pool is inside a transaction"
        );
    }
}

async fn callers_dropped_anywhere_leave_the_store_usable(backend: Backend) {
    let fresh = on(backend).await;
    let records = &fresh.records;
    for round in 0..400_u64 {
        let dropped = (0..16_u64).map(|i| {
            // Cut off after 0.05 to 2 ms: in the claim, the BEGIN, the lock, the end or the
            // commit, wherever each has got to.
            let cut_off = Duration::from_micros(50 + (round * 7 + i) % 40 * 50);
            let name = format!("dropped-{round}-{i}");
            async move {
                let _ = tokio::time::timeout(cut_off, claim_and_end(records, &name)).await;
            }
        });
        join_all(dropped).await;
        no_connection_is_inside_a_transaction(records).await;
    }

    let keys: Vec<String> = (0..20).map(|i| format!("after-{i}")).collect();
    for key in &keys {
        claim_and_end(records, key).await;
    }
    assert_eq!(completed_elsewhere(records, &keys).await, keys.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_callers_dropped_anywhere_leave_the_store_usable() {
    callers_dropped_anywhere_leave_the_store_usable(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_callers_dropped_anywhere_leave_the_store_usable() {
    callers_dropped_anywhere_leave_the_store_usable(Backend::Sqlite).await;
}
