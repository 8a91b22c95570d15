//! Work a service runs in the background until it stops: one shutdown signal (a
//! `watch::Receiver<bool>` that turns true, or whose sender is dropped) and one loop that runs a
//! round of work at an interval until it comes. The engine's completer
//! ([`Completer`](crate::engine::Completer)) and the record store's upkeep run on it, and a
//! service's own periodic work may too.

use std::time::Duration;

use tokio::sync::watch;

/// Resolves once `shutdown` turns true (or its sender is gone, which also means stop).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Runs `round` every `interval` until shutdown, the first at once. A round in progress is
/// finished first; a round that could take long watches the signal itself.
pub async fn every<F, Fut>(interval: Duration, mut shutdown: watch::Receiver<bool>, round: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = ticker.tick() => round().await,
            () = stopped(&mut shutdown) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const TICK: Duration = Duration::from_millis(1);
    /// Far longer than the rounds take: only a loop that never stops reaches it.
    const NEVER: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn rounds_run_until_shutdown_and_not_after() {
        let (stop, shutdown) = watch::channel(false);
        let rounds = AtomicU32::new(0);
        let running = every(TICK, shutdown, || async {
            if rounds.fetch_add(1, Ordering::SeqCst) == 2 {
                stop.send_replace(true);
            }
        });
        let ended = tokio::time::timeout(NEVER, running).await;
        assert!(ended.is_ok(), "still running after shutdown");
        assert_eq!(rounds.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_dropped_sender_stops_the_rounds() {
        let (stop, shutdown) = watch::channel(false);
        drop(stop);
        let running = every(TICK, shutdown, || async {});
        let ended = tokio::time::timeout(NEVER, running).await;
        assert!(ended.is_ok(), "still running with no one to signal it");
    }
}
