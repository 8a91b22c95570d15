//! The outbox's pruning: deletes outbox rows past their retention, at the reaper's interval,
//! in the reaper's bounded batches (`payments_idempotency_sql::in_batches`). With a stream,
//! only published rows go, never unpublished ones; without one, nothing ever publishes a row,
//! `GET /events` is the rows' only reader, and they go by age alone.

use std::time::Duration;

use payments_idempotency_sql::in_batches;
use payments_storage::EventPruning;
use tokio::sync::watch;

use crate::{AppState, error_chain};

pub(crate) async fn run_round(
    state: &AppState,
    batch: i64,
    outbox_retention: Duration,
    shutdown: &mut watch::Receiver<bool>,
) {
    let pruning = match state.events {
        Some(_) => EventPruning::Published,
        None => EventPruning::ByAge,
    };
    let events = in_batches(batch, shutdown, || {
        state.store.prune_events(pruning, outbox_retention, batch)
    })
    .await;
    if let Some(error) = &events.error {
        tracing::warn!(reaper.table = "outbox_events", error = %error_chain(error), "reaper: delete failed");
    }
    if events.deleted > 0 {
        tracing::info!(
            reaper.events_deleted = events.deleted,
            "reaper: outbox events past their retention deleted"
        );
    }
}
