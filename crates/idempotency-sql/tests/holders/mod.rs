//! What the PostgreSQL tests of the group commits ask the database directly: a connection of
//! their own, and how many statements wait on the rows the test holds.

use std::time::Duration;

use payments_idempotency_sql::SqlRecords;
use sqlx::{Connection as _, PgConnection};

/// A connection of the test's own to the records' database.
pub(crate) async fn connection(records: &SqlRecords) -> PgConnection {
    let SqlRecords::Postgres(records) = records else {
        panic!("PostgreSQL's records");
    };
    let options = records.pool().connect_options();
    PgConnection::connect_with(&options)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// Waits until `statements` statements wait for a row lock (bounded). Asked on a connection
/// outside the holders' transactions, which would each see one snapshot of the activity.
pub(crate) async fn until_statements_wait_on_holders(records: &SqlRecords, statements: i64) {
    let mut watcher = connection(records).await;
    for _ in 0..1_000 {
        let (waiting,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap_or_else(|e| panic!("pg_stat_activity: {e}"));
        if waiting == statements {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{statements} statements do not wait on a holder's row");
}
