//! The records table's upkeep, run beside a service by every instance: the reaper, which
//! deletes expired records, and the statistics refresh, which keeps the table's plans up with
//! its growth ([`SqlRecords::refresh_statistics`]).
//!
//! The reaper deletes expired completed and failed records, never pending ones
//! ([`SqlRecords::reap_expired`]), and stays out of the way of requests: each batch is one
//! short statement that walks the expiry index and stops after [`UpkeepSettings::reap_batch`]
//! rows; after each full batch it pauses for as long as that batch took ([`in_batches`]), so
//! it keeps at most half of one database connection busy however much is expired, and pauses
//! longer when a busy database makes its statements slower. At shutdown it stops between
//! batches: a batch is one statement, done or not done. Any number of instances may run it at
//! once: a record is deleted once, by whichever statement reaches it first.

use std::time::{Duration, Instant};

use payments_idempotency::engine::error_chain;
use payments_idempotency::lifecycle::{every, stopped};
use tokio::sync::watch;

use crate::{Error, SqlRecords};

/// How often the upkeep runs, and how much the reaper deletes per statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpkeepSettings {
    /// How often the reaper looks for expired records.
    pub reap_interval: Duration,
    /// The most records one delete statement removes.
    pub reap_batch: i64,
    /// How often the records table's changes are checked against its statistics: one read of
    /// the statistics system, and an `ANALYZE` once the table has grown.
    pub statistics_interval: Duration,
}

impl Default for UpkeepSettings {
    fn default() -> Self {
        Self {
            reap_interval: Duration::from_secs(60),
            reap_batch: 1_000,
            statistics_interval: Duration::from_secs(1),
        }
    }
}

/// The reaper and the statistics refresh of one records table.
#[derive(Debug, Clone)]
pub struct Upkeep {
    records: SqlRecords,
    settings: UpkeepSettings,
}

impl Upkeep {
    /// The upkeep of `records`: a store of either backend ([`PgRecords`](crate::PgRecords),
    /// [`SqliteRecords`](crate::SqliteRecords)) or both ([`SqlRecords`]).
    pub fn new(records: impl Into<SqlRecords>, settings: UpkeepSettings) -> Self {
        let records = records.into();
        Self { records, settings }
    }

    /// Reaps and refreshes the statistics at their intervals until `shutdown`: spawn it beside
    /// the server, and await it after the server stopped.
    pub async fn run(&self, shutdown: watch::Receiver<bool>) {
        let reaper_shutdown = shutdown.clone();
        let reaping = every(self.settings.reap_interval, shutdown.clone(), || {
            let mut shutdown = reaper_shutdown.clone();
            async move {
                self.reap(&mut shutdown).await;
            }
        });
        let refreshing = every(self.settings.statistics_interval, shutdown, || {
            self.refresh_statistics()
        });
        tokio::join!(reaping, refreshing);
    }

    /// Deletes expired records in batches until none is left, a statement fails or
    /// `shutdown` says stop; logs what it did, and returns it.
    pub async fn reap(&self, shutdown: &mut watch::Receiver<bool>) -> Batches<Error> {
        let batch = self.settings.reap_batch;
        let reaped = in_batches(batch, shutdown, || self.records.reap_expired(batch)).await;
        if let Some(error) = &reaped.error {
            tracing::warn!(reaper.table = "idempotency_records", error = %error_chain(error), "reaper: delete failed");
        }
        if reaped.deleted > 0 {
            tracing::info!(
                reaper.deleted = reaped.deleted,
                reaper.statements = reaped.statements,
                reaper.longest_statement_ms = reaped.longest.as_secs_f64() * 1e3,
                "reaper: expired records deleted"
            );
        }
        reaped
    }

    async fn refresh_statistics(&self) {
        match self.records.refresh_statistics().await {
            Ok(true) => tracing::info!("statistics: idempotency_records analyzed"),
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "statistics: cannot analyze idempotency_records");
            }
        }
    }
}

/// What a run of delete statements did.
#[derive(Debug)]
pub struct Batches<E> {
    pub deleted: u64,
    /// Delete statements run, the short last one included.
    pub statements: u64,
    /// The longest of them, as the caller waited for it.
    pub longest: Duration,
    /// The error that ended the run early, if one did.
    pub error: Option<E>,
}

/// Runs `delete` (one statement that deletes at most `batch` rows and says how many it did)
/// until a batch comes back short (nothing more to delete), fails, or `shutdown` says stop,
/// pausing after each full batch for as long as it took (see the module). A service's own
/// pruning (old rows of its own tables) may run on it too.
pub async fn in_batches<E, F, Fut>(
    batch: i64,
    shutdown: &mut watch::Receiver<bool>,
    delete: F,
) -> Batches<E>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<u64, E>>,
{
    let mut done = Batches {
        deleted: 0,
        statements: 0,
        longest: Duration::ZERO,
        error: None,
    };
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
        let done: Batches<()> = in_batches(10, &mut shutdown, || async {
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
        let done: Batches<()> = in_batches(10, &mut shutdown, || async {
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
                Err("no")
            }
        })
        .await;
        assert_eq!((done.deleted, done.statements), (10, 2));
        assert_eq!(done.error, Some("no"));
    }
}
