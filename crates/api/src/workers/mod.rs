//! Background work every instance runs: the kit's completer (the engine's, over every
//! operation) and the records table's upkeep (the SQL record store's reaper and statistics
//! refresh), and this service's own: the pruning of old outbox rows, the outbox relay, the
//! daily reconciliation, the expiry of holds past their `capture_before`, and the metrics
//! recorder's upkeep.
//! All are safe to run on any number of instances at once (`FOR UPDATE SKIP LOCKED`, fenced
//! writes), and all stop at the same shutdown signal as the server.

mod hold_expiry;
mod pruning;
mod reconciler;
mod relay;

use std::time::Duration;

use payments_idempotency::engine::{Completer, CompleterSettings};
use payments_idempotency::lifecycle::every;
use payments_idempotency_sql::{Upkeep, UpkeepSettings};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::AppState;

/// How often the metrics recorder folds its histogram samples into their buckets. A scrape of
/// `/metrics` does the same, but without a scraper the samples would pile up, about 19 bytes a
/// request, for as long as the instance runs.
const METRICS_UPKEEP: Duration = Duration::from_secs(1);

/// How often each worker runs, and how much it takes per round.
#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    pub completer: CompleterSettings,
    /// The records' reaper (its interval and batch are also the outbox pruning's) and the
    /// statistics refresh.
    pub upkeep: UpkeepSettings,
    pub relay_interval: Duration,
    pub relay_batch: i64,
    /// How long an outbox row is kept.
    pub outbox_retention: Duration,
    /// When (UTC) the previous day is reconciled each day; `None` for never.
    pub reconcile_at: Option<chrono::NaiveTime>,
    /// How often the holds past their `capture_before` are canceled.
    pub hold_expiry_interval: Duration,
}

/// Starts the workers; they stop when `shutdown` turns true.
pub(crate) fn spawn(
    state: AppState,
    settings: WorkerSettings,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut workers = Vec::new();
    let completer = Completer::new(state.engine.clone(), settings.completer);
    let completer_shutdown = shutdown.clone();
    workers.push(tokio::spawn(async move {
        completer.run(completer_shutdown).await;
    }));
    let upkeep = Upkeep::new(state.store.records(), settings.upkeep);
    let upkeep_shutdown = shutdown.clone();
    workers.push(tokio::spawn(async move {
        upkeep.run(upkeep_shutdown).await;
    }));
    let s = state.clone();
    let pruning_shutdown = shutdown.clone();
    workers.push(tokio::spawn(every(
        settings.upkeep.reap_interval,
        shutdown.clone(),
        move || {
            let state = s.clone();
            let mut shutdown = pruning_shutdown.clone();
            async move {
                pruning::run_round(
                    &state,
                    settings.upkeep.reap_batch,
                    settings.outbox_retention,
                    &mut shutdown,
                )
                .await
            }
        },
    )));
    let s = state.clone();
    workers.push(tokio::spawn(every(
        settings.hold_expiry_interval,
        shutdown.clone(),
        move || {
            let state = s.clone();
            async move { hold_expiry::run_round(&state).await }
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
