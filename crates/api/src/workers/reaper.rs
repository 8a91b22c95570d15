//! The reaper: deletes expired completed and failed records in batches, never pending ones;
//! then published outbox rows past their retention, never unpublished ones.

use std::time::Duration;

use payments_storage::StoreError;

use crate::{AppState, error_chain};

pub async fn run_round(state: &AppState, batch: i64, outbox_retention: Duration) {
    let records = in_batches(batch, "idempotency_records", || {
        state.store.reap_expired(batch)
    })
    .await;
    if records > 0 {
        tracing::info!(reaper.deleted = records, "reaper: expired records deleted");
    }
    let events = in_batches(batch, "outbox_events", || {
        state.store.prune_published_events(outbox_retention, batch)
    })
    .await;
    if events > 0 {
        tracing::info!(
            reaper.events_deleted = events,
            "reaper: published outbox events deleted"
        );
    }
}

/// Runs `delete` until a batch comes back short (nothing more to delete) or fails, and returns
/// how many rows went. Small batches keep each statement, and any lock it holds, short.
async fn in_batches<F, Fut>(batch: i64, what: &'static str, delete: F) -> u64
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let mut total = 0;
    loop {
        match delete().await {
            Ok(deleted) => {
                total += deleted;
                if deleted < batch.unsigned_abs() {
                    return total;
                }
            }
            Err(error) => {
                tracing::warn!(reaper.table = what, error = %error_chain(&error), "reaper: delete failed");
                return total;
            }
        }
    }
}
