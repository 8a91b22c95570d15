//! The reaper: deletes expired completed and failed records in batches, never pending ones.

use crate::{AppState, error_chain};

pub async fn run_round(state: &AppState, batch: i64) {
    let mut total = 0;
    loop {
        match state.store.reap_expired(batch).await {
            Ok(deleted) => {
                total += deleted;
                if deleted < batch.unsigned_abs() {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "reaper: delete failed");
                break;
            }
        }
    }
    if total > 0 {
        tracing::info!(reaper.deleted = total, "reaper: expired records deleted");
    }
}
