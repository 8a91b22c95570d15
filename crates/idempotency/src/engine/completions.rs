//! Waking duplicates that asked to wait (`Prefer: wait=N`) when a key completes.
//!
//! Completions on this instance are announced in-process and wake waiters at once. A waiter
//! also re-checks the record every [`Completions::POLL`], which covers completions on other
//! instances without a busy loop and without a cross-instance channel.

use std::sync::Arc;
use std::time::Duration;

use crate::{IdempotencyKey, Scope};
use tokio::sync::broadcast;
use tokio::time::Instant;

/// The in-process completion channel.
#[derive(Debug, Clone)]
pub struct Completions {
    sender: broadcast::Sender<Arc<str>>,
}

impl Default for Completions {
    fn default() -> Self {
        // Capacity only bounds how far a slow waiter may lag; a lagging waiter re-checks.
        let (sender, _) = broadcast::channel(1024);
        Self { sender }
    }
}

impl Completions {
    /// How often a waiter re-checks the record for completions elsewhere.
    pub const POLL: Duration = Duration::from_millis(200);

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.sender.subscribe()
    }

    /// Announces that the record under `key` reached an end.
    pub fn announce(&self, scope: &Scope, key: &IdempotencyKey) {
        // No receivers is the common case, not an error.
        let _ = self.sender.send(topic(scope, key).into());
    }

    /// Returns when `key` is announced, at the next poll tick, or at `deadline`, whichever
    /// comes first; the caller then looks at the record again.
    pub async fn wait_for(
        &self,
        receiver: &mut broadcast::Receiver<Arc<str>>,
        scope: &Scope,
        key: &IdempotencyKey,
        deadline: Instant,
    ) {
        let wanted = topic(scope, key);
        let until = deadline.min(Instant::now() + Self::POLL);
        let announced = async {
            loop {
                match receiver.recv().await {
                    Ok(topic) if *topic == *wanted => return,
                    Ok(_) => continue,
                    // Lagged or closed: re-check the record rather than guess.
                    Err(_) => return,
                }
            }
        };
        let _ = tokio::time::timeout_at(until, announced).await;
    }
}

fn topic(scope: &Scope, key: &IdempotencyKey) -> String {
    format!("{}\n{}\n{}", scope.tenant, scope.operation, key)
}
