//! Background workers every instance runs: the completer, the reaper (of expired records and
//! of old outbox rows), the outbox relay, the daily reconciliation, the records table's
//! statistics, and the metrics recorder's upkeep.
//! All are safe to run on any number of instances at once (`FOR UPDATE SKIP LOCKED`, fenced
//! writes), and all stop at the same shutdown signal as the server.

mod completer;
pub(crate) mod reaper;
mod reconciler;
mod relay;
mod statistics;

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::AppState;

/// How often the metrics recorder folds its histogram samples into their buckets. A scrape of
/// `/metrics` does the same, but without a scraper the samples would pile up, about 19 bytes a
/// request, for as long as the instance runs.
const METRICS_UPKEEP: Duration = Duration::from_secs(1);

/// How often the records table's statistics are checked against its changes (`statistics.rs`):
/// one read of the statistics system, and an `ANALYZE` once the table has grown.
const STATISTICS_CHECK: Duration = Duration::from_secs(1);

/// How often each worker runs, and how much it takes per round.
#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    pub completer_interval: Duration,
    /// How many records the completer settles at once, each in a lane of its own.
    pub completer_concurrency: u32,
    /// The most records each of the completer's lanes settles in one round, one after the
    /// other.
    pub completer_batch: u32,
    /// How long after a record's lock ended the completer may settle it.
    pub settle_after: Duration,
    pub reaper_interval: Duration,
    pub reaper_batch: i64,
    pub relay_interval: Duration,
    pub relay_batch: i64,
    /// How long the reaper keeps an outbox row.
    pub outbox_retention: Duration,
    /// When (UTC) the previous day is reconciled each day; `None` for never.
    pub reconcile_at: Option<chrono::NaiveTime>,
}

/// Starts the workers; they stop when `shutdown` turns true.
pub(crate) fn spawn(
    state: AppState,
    settings: WorkerSettings,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut workers = Vec::new();
    let s = state.clone();
    let completer_shutdown = shutdown.clone();
    workers.push(tokio::spawn(every(
        settings.completer_interval,
        shutdown.clone(),
        move || {
            let state = s.clone();
            let shutdown = completer_shutdown.clone();
            async move { completer::run_round(&state, &settings, &shutdown).await }
        },
    )));
    let s = state.clone();
    let reaper_shutdown = shutdown.clone();
    workers.push(tokio::spawn(every(
        settings.reaper_interval,
        shutdown.clone(),
        move || {
            let state = s.clone();
            let mut shutdown = reaper_shutdown.clone();
            async move {
                reaper::run_round(
                    &state,
                    settings.reaper_batch,
                    settings.outbox_retention,
                    &mut shutdown,
                )
                .await
            }
        },
    )));
    let s = state.clone();
    workers.push(tokio::spawn(every(
        STATISTICS_CHECK,
        shutdown.clone(),
        move || {
            let state = s.clone();
            async move { statistics::run_round(&state).await }
        },
    )));
    if let Some(metrics) = state.metrics.clone() {
        let records = state.store.records();
        workers.push(tokio::spawn(every(
            METRICS_UPKEEP,
            shutdown.clone(),
            move || {
                metrics.run_upkeep();
                crate::metrics::record_group_commits(records.group_commits());
                std::future::ready(())
            },
        )));
    }
    if let Some(at) = settings.reconcile_at {
        workers.push(tokio::spawn(reconciler::run(
            state.clone(),
            at,
            shutdown.clone(),
        )));
    }
    if state.events.is_some() {
        workers.push(tokio::spawn(relay::run(
            state,
            settings.relay_interval,
            settings.relay_batch,
            shutdown,
        )));
    }
    workers
}

/// Resolves once `shutdown` turns true (or its sender is gone, which also means stop).
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Runs `round` every `interval` until shutdown. A round in progress is finished first; the
/// rounds that could take long (the completer's, the reaper's) watch the signal themselves.
async fn every<F, Fut>(interval: Duration, mut shutdown: watch::Receiver<bool>, round: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => round().await,
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
