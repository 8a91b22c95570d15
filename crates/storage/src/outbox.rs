//! The outbox's upkeep, written once for both backends: the size of the unpublished backlog,
//! and the pruning of old events. (Publishing differs: each backend's relay takes its
//! rows its own way, in `relay.rs`.)

use std::time::Duration;

use crate::dialect::{Dialect, Statement};
use crate::model::EventPruning;

/// The number of unpublished events and the age of the oldest in seconds (`NULL` when there
/// is none).
pub(crate) fn backlog<'a, DB: Dialect>() -> Statement<'a, DB> {
    let mut sql = Statement::new("SELECT count(*), ");
    sql.push(DB::OLDEST_AGE_SECS)
        .push(" FROM outbox_events WHERE published_at IS NULL");
    sql
}

/// Deletes up to `batch` events older than `retention`, the oldest first.
///
/// With [`EventPruning::Published`], `published_at IS NOT NULL` is spelled out although the
/// comparison implies it: an unpublished row must never go, however old, and the index
/// `outbox_events_published` finds the old rows without reading the whole table. With
/// [`EventPruning::ByAge`] the index `outbox_events_created` does. The backend's
/// `SKIP_LOCKED` keeps the reapers of several instances on disjoint rows.
pub(crate) fn prune<'a, DB: Dialect>(
    pruning: EventPruning,
    retention: Duration,
    batch: i64,
) -> Statement<'a, DB> {
    let column = match pruning {
        EventPruning::Published => "published_at",
        EventPruning::ByAge => "created_at",
    };
    let mut sql = Statement::new(
        "DELETE FROM outbox_events WHERE id IN (SELECT id FROM outbox_events WHERE ",
    );
    if pruning == EventPruning::Published {
        sql.push("published_at IS NOT NULL AND ");
    }
    sql.push(column).push(" < ");
    DB::push_now_minus(&mut sql, retention);
    sql.push(" ORDER BY ")
        .push(column)
        .push(" LIMIT ")
        .value(batch)
        .push(DB::SKIP_LOCKED)
        .push(")");
    sql
}
