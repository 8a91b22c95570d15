//! The in-process simulator the service uses by default, modelled on a slow processor: a call
//! under a new key registers the key as processing, and its outcome exists only once the
//! latency has passed, whether or not the caller is still waiting. Charges (authorisations
//! among them), refunds, captures, voids and payouts keep their keys in books of the same kind,
//! so all follow exactly this protocol, and all are forgotten, with what they made, once the
//! key window has passed since they settled.

mod book;
mod calls;
mod captures;
mod charges;
mod clock;
mod payouts;
mod ports;
mod refunds;
mod settlement;
mod state;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use payments_domain::{
    CancelOutcome, ProcessorCapture, ProcessorCharge, ProcessorError, ProcessorPayout,
    ProcessorRefund, ProcessorVoid,
};

pub(crate) use book::{Answer, Made, Outcome};
pub(crate) use calls::{CaptureCall, ChargeCall, PayoutCall, RefundCall, VoidCall};
pub use settlement::UnknownProcessorId;
pub(crate) use state::{Booked, Kept, State};

use crate::{TestDestination, TestToken};
use book::Begin;
use clock::Clock;

/// The answer to a charge call.
pub(crate) type ChargeAnswer = Answer<Made<ProcessorCharge>>;

/// The answer to a refund call.
pub(crate) type RefundAnswer = Answer<Made<ProcessorRefund>>;

/// The answer to a capture call.
pub(crate) type CaptureAnswer = Answer<Made<ProcessorCapture>>;

/// The answer to a void call.
pub(crate) type VoidAnswer = Answer<Made<ProcessorVoid>>;

/// The answer to a payout call.
pub(crate) type PayoutAnswer = Answer<Made<ProcessorPayout>>;

/// A processor that lives in the service's memory. It forgets everything when the service
/// restarts, so it cannot show exactly-once across crashes; a processor in its own process,
/// reached over HTTP, is what crash tests need.
#[derive(Debug)]
pub struct InMemoryCardProcessor {
    /// Shared with the tasks that finish calls whose callers may have gone.
    state: Arc<Mutex<State>>,
    latency: Duration,
}

impl Default for InMemoryCardProcessor {
    /// No latency, and the default key window.
    fn default() -> Self {
        Self::new(Duration::ZERO, Self::DEFAULT_KEY_WINDOW)
    }
}

impl InMemoryCardProcessor {
    /// How long a key is remembered by default: 7 days, the service's own default
    /// `processor.key_window_secs`. (Stripe's is 24 hours.)
    pub const DEFAULT_KEY_WINDOW: Duration = Duration::from_secs(7 * 24 * 60 * 60);

    /// A simulator whose every new call takes `latency` to come into existence, and which
    /// forgets a key, with what was made under it, once `key_window` has passed since it
    /// settled or was canceled.
    pub fn new(latency: Duration, key_window: Duration) -> Self {
        Self::with_clock(latency, key_window, Clock::system())
    }

    /// A simulator whose every new call takes `latency` to come into existence, with the
    /// default key window.
    pub fn with_latency(latency: Duration) -> Self {
        Self::new(latency, Self::DEFAULT_KEY_WINDOW)
    }

    /// [`InMemoryCardProcessor::new`] reading the time from `clock`.
    pub(crate) fn with_clock(latency: Duration, key_window: Duration, clock: Clock) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::new(clock, key_window))),
            latency,
        }
    }

    /// The number of distinct charges ever created, authorisations included: every key of the
    /// charges' book under which something came into existence.
    pub fn charges_created(&self) -> u64 {
        lock(&self.state).charges.created()
    }

    /// The number of distinct authorisations ever made (charges made with `"capture": false`),
    /// a part of [`InMemoryCardProcessor::charges_created`].
    pub fn authorizations_created(&self) -> u64 {
        lock(&self.state).capturable.created()
    }

    /// The number of distinct captures ever made.
    pub fn captures_created(&self) -> u64 {
        lock(&self.state).captures.created()
    }

    /// The number of distinct voids ever made.
    pub fn voids_created(&self) -> u64 {
        lock(&self.state).voids.created()
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

    /// A charge call (or an authorisation), answered in full.
    pub(crate) async fn submit(&self, call: impl Into<ChargeCall>) -> ChargeAnswer {
        let ChargeCall {
            idempotency_key: key,
            money,
            source,
            metadata,
            capture,
        } = call.into();
        let token = TestToken::from_source(source.as_str());
        let begun = lock(&self.state).charges.begin(&key, |first_attempt| {
            charges::decide(token, money, capture, first_attempt)
        });
        self.process(begun, self.latency_for(token), move |state, outcome| {
            state.settle_charge(key, outcome, token, metadata)
        })
        .await
    }

    /// A refund call, answered in full. It processes as long as a call with its charge's token
    /// (a refund of an unknown charge, for the configured latency), and settles its
    /// reservation when it ends.
    pub(crate) async fn submit_refund(&self, call: impl Into<RefundCall>) -> RefundAnswer {
        let call = call.into();
        let (begun, token) = {
            let mut state = lock(&self.state);
            let State {
                refunds,
                refundable,
                ..
            } = &mut *state;
            let begun = refunds.begin(&call.idempotency_key, |_| refundable.begin(&call));
            (begun, refundable.token_of(&call.processor_charge_id))
        };
        let latency = token.map_or(self.latency, |token| self.latency_for(token));
        let RefundCall {
            idempotency_key: key,
            metadata,
            ..
        } = call;
        self.process(begun, latency, move |state, outcome| {
            state.refundable.settle(&key, &outcome);
            let stamp = state.stamp();
            state.refunds.settle(key, outcome, metadata, stamp)
        })
        .await
    }

    /// A capture call, answered in full. It processes as long as a call with its
    /// authorisation's token (a capture of an unknown one, for the configured latency); the
    /// authorisation is captured as it begins, and refundable once the capture exists.
    pub(crate) async fn submit_capture(&self, call: impl Into<CaptureCall>) -> CaptureAnswer {
        let call = call.into();
        let (begun, token) = {
            let mut state = lock(&self.state);
            let State {
                captures,
                capturable,
                ..
            } = &mut *state;
            let begun = captures.begin(&call.idempotency_key, |_| capturable.capture(&call));
            (begun, capturable.token_of(&call.processor_charge_id))
        };
        let latency = token.map_or(self.latency, |token| self.latency_for(token));
        let CaptureCall {
            idempotency_key: key,
            metadata,
            ..
        } = call;
        self.process(begun, latency, move |state, outcome| {
            state.settle_capture(key, outcome, metadata)
        })
        .await
    }

    /// A void call, answered in full. It processes as a capture does; the authorisation is
    /// voided as it begins.
    pub(crate) async fn submit_void(&self, call: impl Into<VoidCall>) -> VoidAnswer {
        let call = call.into();
        let (begun, token) = {
            let mut state = lock(&self.state);
            let State {
                voids, capturable, ..
            } = &mut *state;
            let begun = voids.begin(&call.idempotency_key, |_| capturable.void(&call));
            (begun, capturable.token_of(&call.processor_charge_id))
        };
        let latency = token.map_or(self.latency, |token| self.latency_for(token));
        let VoidCall {
            idempotency_key: key,
            metadata,
            ..
        } = call;
        self.process(begun, latency, move |state, outcome| {
            let stamp = state.stamp();
            state.voids.settle(key, outcome, metadata, stamp)
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
    pub(crate) async fn submit_payout(&self, call: impl Into<PayoutCall>) -> PayoutAnswer {
        let PayoutCall {
            idempotency_key: key,
            money,
            destination,
            metadata,
        } = call.into();
        let begun = lock(&self.state)
            .payouts
            .begin(&key, |_| payouts::decide(&destination, money));
        let destination = TestDestination::from_destination(destination.as_str());
        self.process(
            begun,
            self.payout_latency(destination),
            move |state, outcome| {
                let stamp = state.stamp();
                state.payouts.settle(key, outcome, metadata, stamp)
            },
        )
        .await
    }

    /// The rest of a call that [`Book::begin`](book::Book::begin) started: the key was
    /// registered before the first await; the wait and `settle` run on their own task, so a
    /// caller that goes away (an HTTP client that timed out drops its handler) does not stop
    /// what it makes from coming into existence, as it would not at a real processor.
    async fn process<T: Send + 'static>(
        &self,
        begun: Begin<T>,
        latency: Duration,
        settle: impl FnOnce(&mut State, Outcome<T>) -> Answer<Made<T>> + Send + 'static,
    ) -> Answer<Made<T>> {
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
    pub(crate) fn find_key<T: Booked>(&self, idempotency_key: &str) -> Option<Made<T>> {
        T::book(&mut lock(&self.state)).find(idempotency_key)
    }

    /// Settles a key for good; synchronous, since it never waits.
    pub(crate) fn cancel_key<T: Booked>(&self, idempotency_key: &str) -> CancelOutcome<Made<T>> {
        let mut state = lock(&self.state);
        let stamp = state.stamp();
        T::book(&mut state).cancel(idempotency_key, stamp)
    }

    /// [`InMemoryCardProcessor::find_key`] as the port states it.
    fn find_value<T: Booked>(&self, idempotency_key: &str) -> Result<Option<T>, ProcessorError> {
        Ok(self.find_key::<T>(idempotency_key).map(|made| made.value))
    }

    /// [`InMemoryCardProcessor::cancel_key`] as the port states it.
    fn cancel_value<T: Booked>(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<T>, ProcessorError> {
        Ok(match self.cancel_key::<T>(idempotency_key) {
            CancelOutcome::Exists(made) => CancelOutcome::Exists(made.value),
            CancelOutcome::StillProcessing => CancelOutcome::StillProcessing,
            CancelOutcome::Canceled => CancelOutcome::Canceled,
        })
    }
}

/// The state, with every key whose window has passed already forgotten: each access sweeps,
/// so no background task is needed and the cost is that of what is forgotten. The state stays
/// consistent even if a holder panicked: every transition is made of inserts and removals that
/// do not fail.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    let mut state = state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    state.forget_expired();
    state
}
