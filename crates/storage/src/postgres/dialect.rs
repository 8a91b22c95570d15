//! PostgreSQL's [`Dialect`]: its clock, its row locks, and how sqlx runs a statement on it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgQueryResult};
use sqlx::{Execute, Executor, PgConnection, Postgres};

use crate::dialect::{Dialect, Statement};

impl Dialect for Postgres {
    const NOW: &'static str = "now()";

    fn answer_bound() -> Option<Duration> {
        payments_idempotency_sql::postgres::answer_bound()
    }
    // Concurrent claims of one existing key queue here, so exactly one of them can take a
    // stale record over.
    const LOCK_ROW: &'static str = " FOR UPDATE";
    const SEALS_LEDGER_LAST: bool = false;
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const OLDEST_AGE_SECS: &'static str = "extract(epoch FROM now() - min(created_at))::float8";
    // Concurrent transactions commit out of `position` order; below the snapshot's xmin every
    // writer has ended (migration `event_feed`).
    const EVENT_FEED_ORDER: &'static str = "writer_xact, position";
    const EVENT_FEED_SETTLED: &'static str =
        " AND writer_xact < pg_snapshot_xmin(pg_current_snapshot())";

    fn push_now_plus(sql: &mut Statement<'_, Self>, after: Duration) {
        // make_interval takes its seconds as a double.
        sql.push("now() + make_interval(secs => ")
            .value(after.as_secs_f64())
            .push(")");
    }

    fn push_now_minus(sql: &mut Statement<'_, Self>, before: Duration) {
        sql.push("now() - make_interval(secs => ")
            .value(before.as_secs_f64())
            .push(")");
    }

    fn push_time(sql: &mut Statement<'_, Self>, time: DateTime<Utc>) {
        sql.value(time);
    }

    fn query<'q, 'a: 'q>(sql: &'q str, arguments: PgArguments) -> impl Execute<'q, Self> + 'q {
        sqlx::query_with(sql, arguments)
    }

    fn on<'c>(connection: &'c mut PgConnection) -> impl Executor<'c, Database = Self> {
        connection
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }
}
