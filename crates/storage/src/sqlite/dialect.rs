//! SQLite's [`Dialect`]: its clock in the one text format every time column holds, no row
//! locks (a claim's `BEGIN IMMEDIATE` keeps every other writer out), and how sqlx runs a
//! statement on it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteArguments, SqliteQueryResult};
use sqlx::{Execute, Executor, Sqlite, SqliteConnection};

use crate::dialect::{Dialect, Statement};

impl Dialect for Sqlite {
    // Every time column holds this one text format, so that text order is time order.
    const NOW: &'static str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

    /// A file in the process: a statement waits for its lock only as long as the busy
    /// timeout, and there is no server that could stop answering.
    fn answer_bound() -> Option<Duration> {
        None
    }
    // No row locks: a claim runs in a `BEGIN IMMEDIATE` transaction, whose write lock keeps
    // every other writer out from its first statement on.
    const LOCK_ROW: &'static str = "";
    const SEALS_LEDGER_LAST: bool = true;
    // One writer at a time: the write lock keeps every other reaper out.
    const SKIP_LOCKED: &'static str = "";
    const OLDEST_AGE_SECS: &'static str =
        "(julianday('now') - julianday(min(created_at))) * 86400.0";
    // One writer at a time: rows commit in `position` order (migration `event_feed`).
    const EVENT_FEED_ORDER: &'static str = "position";
    const EVENT_FEED_SETTLED: &'static str = "";

    fn push_now_plus(sql: &mut Statement<'_, Self>, after: Duration) {
        sql.push("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ")
            .value(offset(after))
            .push(")");
    }

    fn push_now_minus(sql: &mut Statement<'_, Self>, before: Duration) {
        sql.push("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ")
            .value(ago(before))
            .push(")");
    }

    fn push_time(sql: &mut Statement<'_, Self>, time: DateTime<Utc>) {
        sql.value(stored_time(time));
    }

    fn query<'q, 'a: 'q>(
        sql: &'q str,
        arguments: SqliteArguments<'a>,
    ) -> impl Execute<'q, Self> + 'q {
        // The arguments borrow for as long as the query: no longer than they may.
        let arguments: SqliteArguments<'q> = arguments;
        sqlx::query_with(sql, arguments)
    }

    fn on<'c>(connection: &'c mut SqliteConnection) -> impl Executor<'c, Database = Self> {
        connection
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}

/// A duration as an SQLite date modifier, `+30.000 seconds`.
fn offset(duration: Duration) -> String {
    format!("+{:.3} seconds", duration.as_secs_f64())
}

/// A duration as an SQLite date modifier into the past, `-30.000 seconds`.
fn ago(duration: Duration) -> String {
    format!("-{:.3} seconds", duration.as_secs_f64())
}

/// A time written by the service (a charge's creation), at microseconds like PostgreSQL: one
/// fixed width per column, so that text order is time order.
fn stored_time(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}
