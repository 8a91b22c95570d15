//! The completer: settles pending records whose attempt ended without an answer, on behalf of
//! a client that may never retry.
//!
//! Each of its lanes takes over one record at a time, and only once the record's lock ended at
//! least `processor.settle_after_ms` ago, so that any processor call made under that lock has
//! finished at the processor; the engine's settle step (`Engine::settle_abandoned`), with the
//! record's own operation, does the rest. "I could not find a charge" is never read as "there
//! is no charge". The lanes settle `workers.completer_concurrency` records at once: a
//! processor outage that leaves thousands of unknown outcomes is not cleared one processor
//! round trip at a time. Each record is still taken singly, under its own lock (the takeover's
//! `SKIP LOCKED` gives each lane another record), and fenced like any attempt.

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{WorkerSettings, stopped};
use crate::{AppState, error_chain, metrics};

/// Runs `completer_concurrency` lanes until each has settled `completer_batch` records or
/// found none left. Dropping the round (at shutdown) aborts every lane at once.
pub(super) async fn run_round(
    state: &AppState,
    settings: &WorkerSettings,
    shutdown: &watch::Receiver<bool>,
) {
    let mut lanes = JoinSet::new();
    for _ in 0..settings.completer_concurrency {
        let (state, settings, mut shutdown) = (state.clone(), *settings, shutdown.clone());
        lanes.spawn(async move { run_lane(&state, &settings, &mut shutdown).await });
    }
    while lanes.join_next().await.is_some() {}
}

/// Settles up to `completer_batch` records, one at a time, and stops between records (or
/// abandons the one in hand) as soon as `shutdown` says so. A record abandoned mid-way is left
/// as a crash would leave it: pending under the completer's lock, fenced, and settled by
/// whoever takes it next.
async fn run_lane(
    state: &AppState,
    settings: &WorkerSettings,
    shutdown: &mut watch::Receiver<bool>,
) {
    for _ in 0..settings.completer_batch {
        if *shutdown.borrow() {
            return;
        }
        let record = match state
            .engine
            .take_over_abandoned(settings.settle_after)
            .await
        {
            Ok(Some(record)) => record,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "completer: cannot take over a record");
                return;
            }
        };
        // Every line about the record names its tenant and operation: a key alone is only
        // unique within them.
        let span = tracing::info_span!(
            "settle",
            idempotency.tenant = %record.scope.tenant,
            idempotency.operation = %record.scope.operation,
        );
        let _settling = metrics::Settling::begin();
        tokio::select! {
            settled = state.engine.settle_abandoned(&record).instrument(span.clone()) => {
                if let Err(error) = settled {
                    // The record keeps the completer's lock; a later round or a retry resumes it.
                    span.in_scope(|| tracing::warn!(idempotency.key = %record.key, error = %error_chain(&error), "completer: record left pending"));
                }
            }
            () = stopped(shutdown) => return,
        }
    }
}
