//! The operations the engine runs, one module each: what each one supplies (its request, its
//! effect at the processor, the writes of its finish), and nothing of the protocol; and each
//! one's resource: its routes, the body a client sends and the view it reads back. Adding an
//! operation is its module, a field of [`Operations`] and its line in [`routes`].

pub(crate) mod cancel;
pub(crate) mod capture;
pub(crate) mod charge;
mod hold;
pub(crate) mod payout;
pub(crate) mod refund;
pub(crate) mod resolve;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use payments_domain::{
    CancelOutcome, CardProcessor, PayoutProcessor, ProcessorError, SettlementReport,
};
use payments_idempotency::engine::{EffectError, Engine, Idempotent, ProtocolError, Settled};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{Store, Transaction};
use serde::Serialize;

use crate::AppState;
use cancel::CancelCharge;
use capture::CaptureCharge;
use charge::CreateCharge;
use payout::CreatePayout;
use refund::CreateRefund;
use resolve::ResolveException;

/// The schema version every operation of this build answers in (its [`Operation::VERSION`]).
/// The `next-version` build is one up, with the same shapes: it is the other half of a fleet
/// mid-deploy in the rolling-deploy tests, and changes nothing else.
///
/// [`Operation::VERSION`]: payments_idempotency::engine::Operation::VERSION
pub(crate) const SCHEMA_VERSION: SchemaVersion = if cfg!(feature = "next-version") {
    SchemaVersion::new(2)
} else {
    SchemaVersion::new(1)
};

/// The processor of this service: it charges and refunds cards, pays out, and reports what it
/// made each day.
pub trait Processor: CardProcessor + PayoutProcessor + SettlementReport {}

impl<P: CardProcessor + PayoutProcessor + SettlementReport> Processor for P {}

/// What every operation of this service works with: the processor for its effect, and the
/// database for its rows.
#[derive(Debug, Clone)]
pub(crate) struct Ports {
    store: Arc<dyn Store>,
    processor: Arc<dyn Processor>,
    /// How long a hold may wait for its capture.
    authorization_window: Duration,
}

impl Ports {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        processor: Arc<dyn Processor>,
        authorization_window: Duration,
    ) -> Self {
        Self {
            store,
            processor,
            authorization_window,
        }
    }
}

/// Every operation of this service, each as the engine runs it.
#[derive(Debug, Clone)]
pub(crate) struct Operations {
    pub(crate) charges: Arc<Idempotent<CreateCharge>>,
    pub(crate) captures: Arc<Idempotent<CaptureCharge>>,
    pub(crate) cancels: Arc<Idempotent<CancelCharge>>,
    pub(crate) refunds: Arc<Idempotent<CreateRefund>>,
    pub(crate) payouts: Arc<Idempotent<CreatePayout>>,
    pub(crate) resolutions: Arc<Idempotent<ResolveException>>,
}

impl Operations {
    pub(crate) fn new(ports: &Ports) -> Self {
        Self {
            charges: Arc::new(Idempotent::finishing_in_batches(CreateCharge(
                ports.clone(),
            ))),
            captures: Arc::new(Idempotent::new(CaptureCharge(ports.clone()))),
            cancels: Arc::new(Idempotent::new(CancelCharge(ports.clone()))),
            refunds: Arc::new(Idempotent::finishing_in_batches(CreateRefund(
                ports.clone(),
            ))),
            payouts: Arc::new(Idempotent::finishing_in_batches(CreatePayout(
                ports.clone(),
            ))),
            resolutions: Arc::new(Idempotent::new(ResolveException(ports.clone()))),
        }
    }

    /// `engine` with every operation registered, so that its completer finishes any of them.
    pub(crate) fn register(&self, engine: Engine<Transaction>) -> Engine<Transaction> {
        engine
            .with_operation(Arc::clone(&self.charges))
            .with_operation(Arc::clone(&self.captures))
            .with_operation(Arc::clone(&self.cancels))
            .with_operation(Arc::clone(&self.refunds))
            .with_operation(Arc::clone(&self.payouts))
            .with_operation(Arc::clone(&self.resolutions))
    }
}

/// The routes of every operation's resource (an exception's resolution is an operator's, with
/// the other operator routes).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .merge(charge::routes())
        .merge(capture::routes())
        .merge(cancel::routes())
        .merge(refund::routes())
        .merge(payout::routes())
}

/// A 201 with `view` as its body and `location` as its `Location`, serialised once: the bytes
/// sent now are the bytes stored for replays.
pub(crate) fn created<V: Serialize>(
    view: &V,
    location: &str,
) -> Result<StoredResponse, ProtocolError> {
    stored_json(201, view, Some(location))
}

/// A 200 with `view` as its body, serialised once, like [`created`]'s.
pub(crate) fn ok<V: Serialize>(view: &V) -> Result<StoredResponse, ProtocolError> {
    stored_json(200, view, None)
}

/// `view` as the JSON body of a stored response of `status`, with its `Location` if any.
fn stored_json<V: Serialize>(
    status: u16,
    view: &V,
    location: Option<&str>,
) -> Result<StoredResponse, ProtocolError> {
    let body = serde_json::to_vec(view).map_err(|e| ProtocolError::Internal(e.into()))?;
    let location = location.map(|location| ("location", location));
    let headers = std::iter::once(("content-type", "application/json")).chain(location);
    Ok(StoredResponse::new(SCHEMA_VERSION, status, headers, body))
}

/// The processor's refusal or silence, as the engine tells them apart.
fn effect_error(error: ProcessorError) -> EffectError {
    match error {
        ProcessorError::Declined {
            decline_code,
            message,
        } => EffectError::Declined {
            code: decline_code,
            message,
        },
        ProcessorError::Unavailable { reason } => EffectError::Unavailable { reason },
    }
}

/// The processor's answer to a cancel, as the engine's settle reads it.
fn settled<E>(answer: Result<CancelOutcome<E>, ProcessorError>) -> Result<Settled<E>, EffectError> {
    match answer.map_err(effect_error)? {
        CancelOutcome::Exists(effect) => Ok(Settled::Exists(effect)),
        CancelOutcome::StillProcessing => Ok(Settled::StillProcessing),
        CancelOutcome::Canceled => Ok(Settled::Tombstoned),
    }
}
