//! The in-process simulator the service uses by default, modelled on a slow processor: a call
//! under a new key registers the key as processing, and its outcome exists only once the
//! latency has passed, whether or not the caller is still waiting. Charges, refunds and
//! payouts keep their keys in books of the same kind, so all follow exactly this protocol.

mod book;
mod charges;
mod payouts;
mod refunds;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use payments_domain::{
    CancelOutcome, CardProcessor, PayoutProcessor, ProcessorCharge, ProcessorChargeRequest,
    ProcessorError, ProcessorPayout, ProcessorPayoutRequest, ProcessorRefund,
    ProcessorRefundRequest,
};

pub(crate) use book::{Answer, Book, Outcome};

use crate::{TestDestination, TestToken};
use book::Begin;
use refunds::Refundable;

/// The answer to a charge call.
pub(crate) type ChargeAnswer = Answer<ProcessorCharge>;

/// The answer to a refund call.
pub(crate) type RefundAnswer = Answer<ProcessorRefund>;

/// The answer to a payout call.
pub(crate) type PayoutAnswer = Answer<ProcessorPayout>;

/// A processor that lives in the service's memory. It forgets everything when the service
/// restarts, so it cannot show exactly-once across crashes; a processor in its own process,
/// reached over HTTP, is what crash tests need.
#[derive(Debug, Default)]
pub struct InMemoryCardProcessor {
    /// Shared with the tasks that finish calls whose callers may have gone.
    state: Arc<Mutex<State>>,
    latency: Duration,
}

/// Everything the simulator remembers, under one mutex: each key's transitions are atomic,
/// and so is a refund's check of its charge together with its reservation.
#[derive(Debug, Default)]
pub(crate) struct State {
    charges: Book<ProcessorCharge>,
    refunds: Book<ProcessorRefund>,
    refundable: Refundable,
    payouts: Book<ProcessorPayout>,
}

/// What a key of each kind settles to (a charge, a refund), and where its book is: so that a
/// lookup and a cancel are written once for every kind.
pub(crate) trait Kept: Clone + Sized {
    fn book(state: &mut State) -> &mut Book<Self>;
}

impl Kept for ProcessorCharge {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.charges
    }
}

impl Kept for ProcessorRefund {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.refunds
    }
}

impl Kept for ProcessorPayout {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.payouts
    }
}

impl InMemoryCardProcessor {
    /// A simulator whose every new charge or refund takes `latency` to come into existence.
    pub fn with_latency(latency: Duration) -> Self {
        Self {
            latency,
            ..Self::default()
        }
    }

    /// The number of distinct charges ever created.
    pub fn charges_created(&self) -> u64 {
        lock(&self.state).charges.created()
    }

    /// The number of distinct refunds that ever succeeded.
    pub fn refunds_created(&self) -> u64 {
        lock(&self.state).refunds.created()
    }

    /// The number of distinct payouts ever paid.
    pub fn payouts_created(&self) -> u64 {
        lock(&self.state).payouts.created()
    }

    /// How long a new call with `token` processes: the configured latency, plus
    /// [`TestToken::SLOW_LATENCY`] for `tok_slow`.
    fn latency_for(&self, token: TestToken) -> Duration {
        match token {
            TestToken::SucceedsSlowly => self.latency + TestToken::SLOW_LATENCY,
            _ => self.latency,
        }
    }

    /// A charge call, answered in full. A charge that comes into existence becomes refundable
    /// at the same moment.
    pub(crate) async fn submit(&self, request: ProcessorChargeRequest) -> ChargeAnswer {
        let token = TestToken::from_source(request.source.as_str());
        let key = request.idempotency_key;
        let begun = lock(&self.state).charges.begin(&key, |first_attempt| {
            charges::decide(token, request.money, first_attempt)
        });
        self.process(begun, self.latency_for(token), move |state, outcome| {
            if let Outcome::Succeeded(charge) = &outcome {
                state.refundable.add(charge, token);
            }
            state.charges.settle(key, outcome)
        })
        .await
    }

    /// A refund call, answered in full. It processes as long as a call with its charge's token
    /// (a refund of an unknown charge, for the configured latency), and settles its
    /// reservation when it ends.
    pub(crate) async fn submit_refund(&self, request: ProcessorRefundRequest) -> RefundAnswer {
        let (begun, token) = {
            let mut state = lock(&self.state);
            let State {
                refunds,
                refundable,
                ..
            } = &mut *state;
            let begun = refunds.begin(&request.idempotency_key, |_| refundable.begin(&request));
            (begun, refundable.token_of(&request.processor_charge_id))
        };
        let latency = token.map_or(self.latency, |token| self.latency_for(token));
        let key = request.idempotency_key;
        self.process(begun, latency, move |state, outcome| {
            state.refundable.settle(&key, &outcome);
            state.refunds.settle(key, outcome)
        })
        .await
    }

    /// How long a new payout to `destination` processes: the configured latency, plus
    /// [`TestToken::SLOW_LATENCY`] to `ba_slow`.
    fn payout_latency(&self, destination: TestDestination) -> Duration {
        match destination {
            TestDestination::PaysSlowly => self.latency + TestToken::SLOW_LATENCY,
            TestDestination::Pays | TestDestination::Declined => self.latency,
        }
    }

    /// A payout call, answered in full. It processes for the configured latency, plus
    /// [`TestToken::SLOW_LATENCY`] to `ba_slow`.
    pub(crate) async fn submit_payout(&self, request: ProcessorPayoutRequest) -> PayoutAnswer {
        let key = request.idempotency_key;
        let begun = lock(&self.state).payouts.begin(&key, |_| {
            payouts::decide(&request.destination, request.money)
        });
        let destination = TestDestination::from_destination(request.destination.as_str());
        self.process(
            begun,
            self.payout_latency(destination),
            move |state, outcome| state.payouts.settle(key, outcome),
        )
        .await
    }

    /// The rest of a call that [`Book::begin`] started: the key was registered before the
    /// first await; the wait and `settle` run on their own task, so a caller that goes away
    /// (an HTTP client that timed out drops its handler) does not stop the charge or refund
    /// from coming into existence, as it would not at a real processor.
    async fn process<T: Send + 'static>(
        &self,
        begun: Begin<T>,
        latency: Duration,
        settle: impl FnOnce(&mut State, Outcome<T>) -> Answer<T> + Send + 'static,
    ) -> Answer<T> {
        let outcome = match begun {
            Begin::Answered(answer) => return answer,
            Begin::Started(outcome) => outcome,
        };
        let state = Arc::clone(&self.state);
        let processing = tokio::spawn(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            settle(&mut lock(&state), outcome)
        });
        // Dropping this future drops only the handle; the task runs on. It can fail only if
        // the runtime is shutting down, and then the key does stay processing.
        processing.await.unwrap_or(Answer::Processing)
    }

    /// What was made under a key, if it exists yet; synchronous, since it never waits.
    pub(crate) fn find_key<T: Kept>(&self, idempotency_key: &str) -> Option<T> {
        T::book(&mut lock(&self.state)).find(idempotency_key)
    }

    /// Settles a key for good; synchronous, since it never waits.
    pub(crate) fn cancel_key<T: Kept>(&self, idempotency_key: &str) -> CancelOutcome<T> {
        T::book(&mut lock(&self.state)).cancel(idempotency_key)
    }
}

/// The state stays consistent even if a holder panicked: every transition is made of inserts
/// that do not fail.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
        Ok(lock(&self.state).charges.find(idempotency_key))
    }

    async fn cancel(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCharge>, ProcessorError> {
        Ok(self.cancel_key(idempotency_key))
    }

    async fn refund(
        &self,
        request: ProcessorRefundRequest,
    ) -> Result<ProcessorRefund, ProcessorError> {
        let answer = self.submit_refund(request).await;
        answer.into_result()
    }

    async fn find_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorRefund>, ProcessorError> {
        Ok(self.find_key::<ProcessorRefund>(idempotency_key))
    }

    async fn cancel_refund(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorRefund>, ProcessorError> {
        let mut state = lock(&self.state);
        Ok(state.refunds.cancel(idempotency_key))
    }
}

#[async_trait]
impl PayoutProcessor for InMemoryCardProcessor {
    async fn payout(
        &self,
        request: ProcessorPayoutRequest,
    ) -> Result<ProcessorPayout, ProcessorError> {
        self.submit_payout(request).await.into_result()
    }

    async fn find_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorPayout>, ProcessorError> {
        Ok(self.find_key::<ProcessorPayout>(idempotency_key))
    }

    async fn cancel_payout(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorPayout>, ProcessorError> {
        Ok(self.cancel_key(idempotency_key))
    }
}
