//! Attempts that outlive their client. An idempotent attempt runs on a task of its own, and the
//! handler only waits for its answer: a client that goes away (its own timeout, a closed
//! connection, a reset HTTP/2 stream) or a timeout layer ends the wait, never the attempt.
//! Stopped halfway, an attempt would leave an effect it made unrecorded and its key locked
//! until a retry took the lock over or the completer settled it; run to its end, it records the
//! effect at once. At shutdown, after the server has drained its requests,
//! [`Attempts::wait_for_all`] waits for the attempts whose clients left.

use std::panic;

use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// The attempts running on this instance. Cheap to clone: every clone counts the same tasks.
#[derive(Debug, Clone, Default)]
pub struct Attempts {
    tracker: TaskTracker,
}

/// An attempt stopped before its end: the runtime is going away. It stopped where a crash
/// would have, and the engine recovers it as it recovers a crash.
#[derive(Debug, thiserror::Error)]
#[error("the attempt was stopped before its end: the runtime is shutting down")]
pub struct AttemptStopped;

impl Attempts {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `attempt` on a task of its own, in the caller's tracing span, and waits for what
    /// it gives. Dropping the returned future ends only the wait. A panic in the attempt
    /// resurfaces here, in the handler, as if the attempt had run inline.
    pub async fn run<F>(&self, attempt: F) -> Result<F::Output, AttemptStopped>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self
            .tracker
            .spawn(attempt.instrument(tracing::Span::current()));
        match task.await {
            Ok(answer) => Ok(answer),
            Err(ended) if ended.is_panic() => panic::resume_unwind(ended.into_panic()),
            Err(_) => Err(AttemptStopped),
        }
    }

    /// How many attempts are running now.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Waits until every attempt has ended, those started meanwhile included: call it at
    /// shutdown, once the server stopped taking requests.
    pub async fn wait_for_all(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn an_attempt_whose_waiter_went_away_runs_to_its_end() {
        let attempts = Attempts::new();
        let (go, proceed) = oneshot::channel::<()>();
        let ended = Arc::new(AtomicBool::new(false));
        let waiting = attempts.run({
            let ended = Arc::clone(&ended);
            async move {
                let _ = proceed.await;
                ended.store(true, Ordering::SeqCst);
            }
        });
        // The client goes away: its wait is dropped before the attempt ends.
        let gave_up = tokio::time::timeout(Duration::from_millis(10), waiting).await;
        assert!(gave_up.is_err());
        assert!(!ended.load(Ordering::SeqCst));
        assert_eq!(attempts.running(), 1);
        let _ = go.send(());
        let all = tokio::time::timeout(Duration::from_secs(10), attempts.wait_for_all()).await;
        assert!(all.is_ok(), "wait_for_all never returned");
        assert!(
            ended.load(Ordering::SeqCst),
            "the attempt was stopped halfway"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "the attempt's own panic")]
    async fn a_panic_in_an_attempt_resurfaces_in_its_waiter() {
        let _ = Attempts::new()
            .run(async { panic!("the attempt's own panic") })
            .await;
    }
}
