//! The outbox relay: publishes `payment.completed` events to the Redis stream.
//!
//! Redis down is an ordinary condition: the round fails, nothing is marked published, and the
//! relay backs off (doubling up to [`MAX_BACKOFF`]) and tries again. No event is lost.

use std::time::Duration;

use payments_storage::RelayError;
use tokio::sync::watch;

use crate::{AppState, error_chain, metrics};

const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub(super) async fn run(
    state: AppState,
    interval: Duration,
    batch: i64,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(stream) = state.events.clone() else {
        return;
    };
    let mut delay = interval;
    loop {
        delay = match relay_all(&state, &stream, batch).await {
            Ok(()) => interval,
            Err(error) => {
                if matches!(error, RelayError::Sink(_)) {
                    metrics::redis_error(metrics::RedisCall::Xadd);
                }
                tracing::warn!(error = %error_chain(&error), retry_in_ms = delay.as_millis() as u64, "relay: publish failed");
                (delay * 2).min(MAX_BACKOFF)
            }
        };
        if let Ok(backlog) = state.store.outbox_backlog().await {
            metrics::outbox_backlog(backlog.unpublished, backlog.oldest_age_secs);
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Publishes batches until the backlog is empty.
async fn relay_all(
    state: &AppState,
    stream: &payments_redis::EventStream,
    batch: i64,
) -> Result<(), RelayError> {
    loop {
        let published = state.store.relay_outbox(batch, stream).await?;
        metrics::events_published(published);
        if (published as i64) < batch {
            return Ok(());
        }
    }
}
