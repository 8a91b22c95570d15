//! The completer: settles pending records whose attempt ended without an answer (its client
//! went away, its process died), on behalf of a client that may never retry, for every
//! operation registered with the engine.
//!
//! Each of its lanes takes over one record at a time, and only once the record's lock ended at
//! least [`CompleterSettings::settle_after`] ago, so that any effect call made under that lock
//! has finished at the effect port; the engine's settle step ([`Engine::settle_abandoned`]),
//! with the record's own operation, does the rest. "I could not find an effect" is never read
//! as "there is no effect". The lanes settle [`CompleterSettings::lanes`] records at once: an
//! outage of the effect port that leaves thousands of unknown outcomes is not cleared one round
//! trip at a time. Each record is still taken singly, under its own lock (the takeover's
//! `SKIP LOCKED` gives each lane another record), and fenced like any attempt, so any number of
//! instances may run a completer at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use super::{Engine, error_chain};
use crate::lifecycle::{every, stopped};

/// How often the completer runs, and how much it takes per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompleterSettings {
    /// How often a round starts (after the last one ended).
    pub interval: Duration,
    /// How many records a round settles at once, each in a lane of its own.
    pub lanes: u32,
    /// The most records each lane settles in one round, one after the other.
    pub batch: u32,
    /// How long after a record's lock ended the completer may settle it: longer than any
    /// effect call made under that lock can take to finish at the effect port.
    pub settle_after: Duration,
}

impl Default for CompleterSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            lanes: 4,
            batch: 100,
            settle_after: Duration::from_secs(10),
        }
    }
}

/// The completer of an engine's registered operations.
#[derive(Debug)]
pub struct Completer<T> {
    engine: Arc<Engine<T>>,
    settings: CompleterSettings,
}

impl<T: Send + 'static> Completer<T> {
    pub fn new(engine: Arc<Engine<T>>, settings: CompleterSettings) -> Self {
        Self { engine, settings }
    }

    /// Runs a round every [`CompleterSettings::interval`] until `shutdown`: spawn it beside the
    /// server, and await it after the server stopped.
    pub async fn run(&self, shutdown: watch::Receiver<bool>) {
        let round_shutdown = shutdown.clone();
        every(self.settings.interval, shutdown, || {
            self.run_round(&round_shutdown)
        })
        .await;
    }

    /// Runs [`CompleterSettings::lanes`] lanes until each has settled
    /// [`CompleterSettings::batch`] records or found none left. Dropping the round (at
    /// shutdown) stops every lane at once.
    pub async fn run_round(&self, shutdown: &watch::Receiver<bool>) {
        let lanes = (0..self.settings.lanes).map(|_| self.run_lane(shutdown.clone()));
        futures::future::join_all(lanes).await;
    }

    /// Settles up to [`CompleterSettings::batch`] records, one at a time, and stops between
    /// records (or abandons the one in hand) as soon as `shutdown` says so. A record abandoned
    /// mid-way is left as a crash would leave it: pending under the completer's lock, fenced,
    /// and settled by whoever takes it next.
    async fn run_lane(&self, mut shutdown: watch::Receiver<bool>) {
        let engine = &self.engine;
        for _ in 0..self.settings.batch {
            if *shutdown.borrow() {
                return;
            }
            let record = match engine.take_over_abandoned(self.settings.settle_after).await {
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
            let _settling = Settling::begin(engine.observer.as_ref());
            tokio::select! {
                settled = engine.settle_abandoned(&record).instrument(span.clone()) => {
                    if let Err(error) = settled {
                        // The record keeps the completer's lock; a later round or a retry resumes it.
                        span.in_scope(|| tracing::warn!(idempotency.key = %record.key, error = %error_chain(&error), "completer: record left pending"));
                    }
                }
                () = stopped(&mut shutdown) => return,
            }
        }
    }
}

/// A record being settled, told to the observer when it starts and when it ends, however it
/// ends (a lane stopped at shutdown included).
struct Settling<'a>(&'a dyn super::Observer);

impl<'a> Settling<'a> {
    fn begin(observer: &'a dyn super::Observer) -> Self {
        observer.settle_began();
        Self(observer)
    }
}

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        self.0.settle_ended();
    }
}
