//! The charge handlers and what every handler shares: HTTP in, [`InMemoryCardProcessor`]
//! calls, HTTP out. No outcome is decided here; the simulator owns the token rules, the refund,
//! capture and void rules, and the idempotency.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use payments_domain::{
    Amount, CancelOutcome, CaptureMethod, Currency, CurrencyError, Money, PaymentSource,
    ProcessorCharge, ProcessorMetadata, TenantId,
};
use serde::Serialize;

use super::error::SimError;
use crate::InMemoryCardProcessor;
use crate::simulator::{Answer, Booked, ChargeCall, Made};
use crate::wire::{
    CANCELED, CancelView, CanceledView, ChargeBody, ChargeView, FindQuery, IDEMPOTENCY_KEY,
    Metadata, StatsView,
};

/// Shared by every handler; the simulator guards its own state.
pub(crate) type Sim = Arc<InMemoryCardProcessor>;

/// The longest idempotency key accepted, as in the service itself.
pub(super) const MAX_KEY_LEN: usize = 255;

/// The longest metadata value accepted, as at Stripe.
const MAX_METADATA_LEN: usize = 500;

/// `POST /v1/charges`: creates the charge (only authorises it with `"capture": false`), or
/// returns the one already made under the key.
pub(crate) async fn create_charge(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: Result<Json<ChargeBody>, JsonRejection>,
) -> Result<Json<ChargeView>, SimError> {
    let idempotency_key = idempotency_key(&headers)?;
    let Json(body) = body.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    let call = ChargeCall {
        idempotency_key,
        money: money(body.amount, &body.currency)?,
        source: PaymentSource::new(body.source)
            .map_err(|e| SimError::InvalidRequest(e.to_string()))?,
        metadata: metadata(body.metadata)?,
        capture: match body.capture {
            Some(false) => CaptureMethod::Manual,
            None | Some(true) => CaptureMethod::Automatic,
        },
    };
    let charge = answered(sim.submit(call).await)?;
    tracing::info!(
        charge.id = %charge.value.id,
        charge.outcome = charge.value.status.as_str(),
        "charge"
    );
    Ok(Json(ProcessorCharge::view(&charge)))
}

/// What the server needs of each kind of call the simulator keeps keys for (charges,
/// refunds, captures, voids, payouts), so that one lookup handler and one cancel handler serve
/// them all alike.
pub(crate) trait Served: Booked + Send + 'static {
    type View: Serialize;
    /// The 404 message of a lookup that finds nothing.
    const MISSING: &'static str;
    /// What was made, as the server shows it, with its metadata and when it was created.
    fn view(made: &Made<Self>) -> Self::View;
}

impl Served for ProcessorCharge {
    type View = ChargeView;
    const MISSING: &'static str = "No charge was created under this idempotency key.";

    fn view(made: &Made<Self>) -> ChargeView {
        let charge = &made.value;
        ChargeView {
            id: charge.id.clone(),
            amount: charge.money.amount.minor_units(),
            currency: charge.money.currency.code().to_owned(),
            status: charge.status.as_str().to_owned(),
            created: made.created_at.timestamp(),
            metadata: Metadata::of(made.metadata.as_ref()),
        }
    }
}

/// `GET /v1/charges?idempotency_key=K` (and the same for every other kind): what was made
/// under K, or 404 (also while a call under K is processing). Never makes anything.
pub(crate) async fn find<T: Served>(
    State(sim): State<Sim>,
    query: Result<Query<FindQuery>, QueryRejection>,
) -> Result<Json<T::View>, SimError> {
    let Query(query) =
        query.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    match sim.find_key::<T>(&query.idempotency_key) {
        Some(made) => Ok(Json(T::view(&made))),
        None => Err(SimError::NotFound(T::MISSING.to_owned())),
    }
}

/// `POST /v1/charges/cancel` (and the same for every other kind): what was made under the
/// key; or 409 while a call under it is processing; or else the key is tombstoned, and nothing
/// can ever be made under it.
pub(crate) async fn cancel<T: Served>(
    State(sim): State<Sim>,
    headers: HeaderMap,
) -> Result<Json<CancelView<T::View>>, SimError> {
    let idempotency_key = idempotency_key(&headers)?;
    match sim.cancel_key::<T>(&idempotency_key) {
        CancelOutcome::Exists(made) => Ok(Json(CancelView::Exists(T::view(&made)))),
        CancelOutcome::StillProcessing => Err(SimError::Processing),
        CancelOutcome::Canceled => {
            tracing::info!(idempotency.outcome = "canceled", "cancel");
            Ok(Json(CancelView::Canceled(CanceledView {
                status: CANCELED.to_owned(),
            })))
        }
    }
}

/// `GET /v1/stats`: what tests count to prove "exactly once" at the processor.
pub(crate) async fn stats(State(sim): State<Sim>) -> Json<StatsView> {
    Json(StatsView {
        charges_created: sim.charges_created(),
        authorizations_created: sim.authorizations_created(),
        captures_created: sim.captures_created(),
        voids_created: sim.voids_created(),
        refunds_created: sim.refunds_created(),
        payouts_created: sim.payouts_created(),
    })
}

/// `GET /healthz`.
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Any other path: the same JSON error shape as everything else.
pub(crate) async fn not_found() -> SimError {
    SimError::NotFound("No such resource.".into())
}

/// A call's answer as HTTP: what it made, or the error that says why it made nothing. The
/// conflicts keep their own codes, which the port folds into `Unavailable`.
pub(super) fn answered<T>(answer: Answer<T>) -> Result<T, SimError> {
    match answer {
        Answer::Settled(outcome) => outcome.into_result().map_err(SimError::from),
        Answer::Processing => Err(SimError::Processing),
        Answer::KeyCanceled => Err(SimError::KeyCanceled),
    }
}

pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<String, SimError> {
    let value = headers
        .get(IDEMPOTENCY_KEY)
        .ok_or(SimError::MissingIdempotencyKey)?;
    match value.to_str() {
        Ok(key) if !key.is_empty() && key.len() <= MAX_KEY_LEN => Ok(key.to_owned()),
        _ => Err(SimError::InvalidRequest(format!(
            "The Idempotency-Key must be 1 to {MAX_KEY_LEN} printable ASCII characters."
        ))),
    }
}

pub(super) fn money(amount: i64, currency: &str) -> Result<Money, SimError> {
    let amount = Amount::new(amount).map_err(|e| SimError::InvalidRequest(e.to_string()))?;
    let currency: Currency = currency
        .parse()
        .map_err(|e: CurrencyError| SimError::InvalidRequest(e.to_string()))?;
    Ok(Money::new(amount, currency))
}

/// A body's `metadata` as the simulator keeps it: both values, each 1 to
/// [`MAX_METADATA_LEN`] characters, or neither.
pub(super) fn metadata(metadata: Metadata) -> Result<Option<ProcessorMetadata>, SimError> {
    let fits = |value: &str| !value.is_empty() && value.chars().count() <= MAX_METADATA_LEN;
    match (metadata.tenant, metadata.resource_id) {
        (None, None) => Ok(None),
        (Some(tenant), Some(resource_id)) if fits(&tenant) && fits(&resource_id) => Ok(Some(
            ProcessorMetadata::new(TenantId::new(tenant), resource_id),
        )),
        _ => Err(SimError::InvalidRequest(format!(
            "metadata must have both tenant and resource_id, each 1 to {MAX_METADATA_LEN} \
             characters, or neither."
        ))),
    }
}
