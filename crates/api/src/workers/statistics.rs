//! Keeps the records table's statistics up with its growth: every second, the table is
//! analyzed if more of its rows changed since it was last analyzed than that analyze counted
//! (`SqlRecords::refresh_statistics`). PostgreSQL plans the claims' and the finishes'
//! statements over those statistics, and a plan made over a new database's first rows reads,
//! for each batch, the whole table, or the pending index's entry of every record completed
//! since the table was last vacuumed. Autovacuum analyzes a table a minute at best after it grew, and never when it is
//! off; this worker does within a second, and then about every time the table doubles. With
//! autovacuum on, a table past its first minute is analyzed long before this rule would.

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
