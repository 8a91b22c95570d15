//! The reaper: deletes expired completed and failed records in batches, never pending ones;
//! then outbox rows past their retention. With a stream, only published rows go, never
//! unpublished ones; without one, nothing ever publishes a row, `GET /events` is the rows'
//! only reader, and they go by age alone.
//!
//! It stays out of the way of requests. Each batch is one short statement that walks the
//! expiry index and stops after `batch` rows; after each full batch the reaper pauses for as
//! long as that batch took, so it keeps at most half of one database connection busy however
//! much is expired, and pauses longer when a busy database makes its statements slower. At
//! shutdown it stops between batches: a batch is one statement, done or not done.

use std::time::{Duration, Instant};

use payments_storage::{EventPruning, StoreError};
use tokio::sync::watch;

use super::stopped;
use crate::{AppState, error_chain};

pub(crate) async fn run_round(
    state: &AppState,
    batch: i64,
    outbox_retention: Duration,
    shutdown: &mut watch::Receiver<bool>,
) {
    let store = state.store.records();
    let reap = || async { store.reap_expired(batch).await.map_err(StoreError::from) };
    let records = in_batches(batch, shutdown, reap).await;
    records.log("idempotency_records");
    if records.deleted > 0 {
        tracing::info!(
            reaper.deleted = records.deleted,
            reaper.statements = records.statements,
            reaper.longest_statement_ms = records.longest.as_secs_f64() * 1e3,
            "reaper: expired records deleted"
        );
    }
    let pruning = match state.events {
        Some(_) => EventPruning::Published,
        None => EventPruning::ByAge,
    };
    let events = in_batches(batch, shutdown, || {
        state.store.prune_events(pruning, outbox_retention, batch)
    })
    .await;
    events.log("outbox_events");
    if events.deleted > 0 {
        tracing::info!(
            reaper.events_deleted = events.deleted,
            "reaper: outbox events past their retention deleted"
        );
    }
}

/// What a run of batches did.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    pub deleted: u64,
    /// Delete statements run, the short last one included.
    pub statements: u64,
    /// The longest of them, as the reaper waited for it.
    pub longest: Duration,
    /// The error that ended the run early, if one did.
    pub error: Option<StoreError>,
}

impl Batches {
    fn log(&self, table: &'static str) {
        if let Some(error) = &self.error {
            tracing::warn!(reaper.table = table, error = %error_chain(error), "reaper: delete failed");
        }
    }
}

/// Runs `delete` until a batch comes back short (nothing more to delete), fails, or shutdown
/// is signalled, pausing after each full batch for as long as it took (see the module).
pub(crate) async fn in_batches<F, Fut>(
    batch: i64,
    shutdown: &mut watch::Receiver<bool>,
    delete: F,
) -> Batches
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let mut done = Batches::default();
    loop {
        if *shutdown.borrow() {
            return done;
        }
        let started = Instant::now();
        let deleted = delete().await;
        let took = started.elapsed();
        done.statements += 1;
        done.longest = done.longest.max(took);
        match deleted {
            Ok(deleted) => {
                done.deleted += deleted;
                if deleted < batch.unsigned_abs() {
                    return done;
                }
            }
            Err(error) => {
                done.error = Some(error);
                return done;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(took) => {}
            () = stopped(shutdown) => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_short_batch_ends_the_run() {
        let (_tx, mut shutdown) = watch::channel(false);
        let calls = AtomicU64::new(0);
        let done = in_batches(10, &mut shutdown, || async {
            Ok(if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                10
            } else {
                3
            })
        })
        .await;
        assert_eq!((done.deleted, done.statements), (23, 3));
        assert!(done.error.is_none());
    }

    #[tokio::test]
    async fn it_stops_between_batches_at_shutdown() {
        let (tx, mut shutdown) = watch::channel(false);
        let calls = AtomicU64::new(0);
        let done = in_batches(10, &mut shutdown, || async {
            // Always a full batch: only the signal, seen after the third, ends the run.
            if calls.fetch_add(1, Ordering::SeqCst) == 2 {
                tx.send_replace(true);
            }
            Ok(10)
        })
        .await;
        assert_eq!((done.deleted, done.statements), (30, 3));
    }

    #[tokio::test]
    async fn a_failed_batch_ends_the_run_with_its_error() {
        let (_tx, mut shutdown) = watch::channel(false);
        let calls = AtomicU64::new(0);
        let done = in_batches(10, &mut shutdown, || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Ok(10)
            } else {
                Err(StoreError::Corrupt("no".into()))
            }
        })
        .await;
        assert_eq!((done.deleted, done.statements), (10, 2));
        assert!(matches!(done.error, Some(StoreError::Corrupt(_))));
    }
}
