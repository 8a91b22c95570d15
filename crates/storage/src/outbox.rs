//! The outbox's upkeep, written once for both backends: the size of the unpublished backlog,
//! and the pruning of published events. (Publishing differs: each backend's relay takes its
//! rows its own way, in `workers.rs`.)

use std::time::Duration;

use sqlx::QueryBuilder;

use crate::fenced::{Dialect, PushValue};

/// The number of unpublished events and the age of the oldest in seconds (`NULL` when there
/// is none).
pub(crate) fn backlog<'a, DB: Dialect>() -> QueryBuilder<'a, DB> {
    let mut sql = DB::builder("SELECT count(*), ");
    sql.push(DB::OLDEST_AGE_SECS)
        .push(" FROM outbox_events WHERE published_at IS NULL");
    sql
}

/// Deletes up to `batch` events published more than `retention` ago.
///
/// `published_at IS NOT NULL` is spelled out although the comparison implies it: an
/// unpublished row must never go, however old. The index `outbox_events_published` finds the
/// old rows without reading the whole table, and the backend's `SKIP_LOCKED` keeps the
/// reapers of several instances on disjoint rows.
pub(crate) fn prune_published<'a, DB: Dialect>(
    retention: Duration,
    batch: i64,
) -> QueryBuilder<'a, DB> {
    let mut sql = DB::builder(
        "DELETE FROM outbox_events WHERE id IN (
             SELECT id FROM outbox_events
             WHERE published_at IS NOT NULL AND published_at < ",
    );
    DB::push_now_minus(&mut sql, retention);
    sql.push(" LIMIT ")
        .value(batch)
        .push(DB::SKIP_LOCKED)
        .push(")");
    sql
}
