//! Keeps the records table's statistics up with its growth: every second, the table is
//! analyzed if more of its rows changed since it was last analyzed than that analyze counted
//! (`SqlRecords::refresh_statistics`). Why plans over stale statistics cost a growing table
//! so much is told once, at `PgRecords::refresh_statistics` in the record store's crate.

use crate::{AppState, error_chain};

pub(crate) async fn run_round(state: &AppState) {
    match state.store.records().refresh_statistics().await {
        Ok(true) => tracing::info!("statistics: idempotency_records analyzed"),
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "statistics: cannot analyze idempotency_records");
        }
    }
}
