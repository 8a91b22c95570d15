//! The in-process simulator the service uses by default, modelled on a slow processor: a call
//! under a new key registers the key as processing, and its outcome exists only once the
//! latency has passed, whether or not the caller is still waiting.

mod book;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use payments_domain::{
    CancelOutcome, CardProcessor, ProcessorCharge, ProcessorChargeRequest, ProcessorError,
};

pub(crate) use book::{ChargeAnswer, Outcome};

use crate::TestToken;
use book::{Begin, Book};

/// A processor that lives in the service's memory. It forgets everything when the service
/// restarts, so it cannot show exactly-once across crashes; a processor in its own process,
/// reached over HTTP, is what crash tests need.
#[derive(Debug, Default)]
pub struct InMemoryCardProcessor {
    /// Shared with the tasks that finish calls whose callers may have gone.
    book: Arc<Mutex<Book>>,
    latency: Duration,
}

impl InMemoryCardProcessor {
    /// A simulator whose every new charge takes `latency` to come into existence.
    pub fn with_latency(latency: Duration) -> Self {
        Self {
            latency,
            ..Self::default()
        }
    }

    /// The number of distinct charges ever created.
    pub fn charges_created(&self) -> u64 {
        lock(&self.book).charges_created()
    }

    /// How long a new call with `token` processes: the configured latency, plus
    /// [`TestToken::SLOW_LATENCY`] for `tok_slow`.
    fn latency_for(&self, token: TestToken) -> Duration {
        match token {
            TestToken::SucceedsSlowly => self.latency + TestToken::SLOW_LATENCY,
            _ => self.latency,
        }
    }

    /// A charge call, answered in full. The key is registered before the first await; the
    /// wait and the recording of the outcome run on their own task, so a caller that goes
    /// away (an HTTP client that timed out drops its handler) does not stop the charge from
    /// coming into existence, as it would not at a real processor.
    pub(crate) async fn submit(&self, request: ProcessorChargeRequest) -> ChargeAnswer {
        let token = TestToken::from_source(request.source.as_str());
        let outcome = match lock(&self.book).begin(&request.idempotency_key, token, request.money) {
            Begin::Answered(answer) => return answer,
            Begin::Started(outcome) => outcome,
        };
        let latency = self.latency_for(token);
        let book = Arc::clone(&self.book);
        let key = request.idempotency_key;
        let processing = tokio::spawn(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            lock(&book).settle(key, outcome)
        });
        // Dropping this future drops only the handle; the task runs on. It can fail only if
        // the runtime is shutting down, and then the key does stay processing.
        processing.await.unwrap_or(ChargeAnswer::Processing)
    }

    /// Settles a key for good; synchronous, since it never waits.
    pub(crate) fn cancel_key(&self, idempotency_key: &str) -> CancelOutcome<ProcessorCharge> {
        lock(&self.book).cancel(idempotency_key)
    }
}

/// The state stays consistent even if a holder panicked: every transition is one insert.
fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl CardProcessor for InMemoryCardProcessor {
    async fn charge(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError> {
        self.submit(request).await.into_result()
    }

    async fn find_charge(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorCharge>, ProcessorError> {
        Ok(lock(&self.book).find(idempotency_key))
    }

    async fn cancel(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCharge>, ProcessorError> {
        Ok(self.cancel_key(idempotency_key))
    }
}
