//! `charges.create`: charge a card. The request is [`ChargeRequest`], the effect a
//! [`ProcessorCharge`], and the finish writes the charge, its balanced ledger transaction and
//! its `payment.completed` event in the transaction the engine completes the record in.
//!
//! The charge as a resource is here too: its routes (`POST /charges`, `GET /charges/{id}`,
//! `GET /charges`), the body a client sends and the view it reads back.

use async_trait::async_trait;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use payments_domain::{
    Capture, CaptureMethod, Charge, ChargeId, ChargeRequest, ManualCapture, PaymentSource,
    ProcessorCharge, ProcessorChargeRequest, ProcessorMetadata, SourceError, TenantId,
};
use payments_idempotency::engine::{
    EffectError, FinishesInBatches, Operation, Owner, Prepared, Preparing, ProtocolError, Settled,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{ListCharges, StoreError, Transaction, captures};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Ports, SCHEMA_VERSION, created, effect_error, settled};
use crate::extract::{ApiQuery, IdempotentCall, JsonBytes, Tenant};
use crate::failpoint::{self, Failure};
use crate::handling::{ListParams, run_idempotent, tenants};
use crate::views::{
    List, card_number, description_field, insert_description, invalid_field, json_body,
    money_field, money_json, timestamp,
};
use crate::{ApiError, AppState, Decline};

/// Creating a charge: the card processor is its effect port, and the store holds its charge,
/// ledger and outbox rows.
#[derive(Debug)]
pub(crate) struct CreateCharge(pub Ports);

/// A charge ready for the processor: the request, and the ids the charge will have, fixed by
/// the record's generation before the processor is called, so that the processor keeps them
/// with the charge (its metadata) whether or not the service ever learns its answer.
#[derive(Debug)]
pub(crate) struct PlannedCharge {
    id: ChargeId,
    tenant: TenantId,
    request: ChargeRequest,
}

#[async_trait]
impl Operation for CreateCharge {
    type Request = ChargeRequest;
    type Plan = PlannedCharge;
    type Effect = ProcessorCharge;
    type Transaction = Transaction;

    const FAMILY: &'static str = "charges.create";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "charge";
    const ROUTE: (&'static str, &'static str) = ("POST", "/charges");

    fn canonical_request(request: &ChargeRequest) -> serde_json::Value {
        CreateChargeBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<ChargeRequest> {
        CreateChargeBody::parse(body).ok()
    }

    /// A charge needs nothing but its request and its record's generation: no transaction, so
    /// a first charge stays at two commits (the claim and the finish).
    async fn prepare(
        &self,
        _: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &ChargeRequest,
    ) -> Result<Prepared<PlannedCharge>, ProtocolError> {
        Ok(Prepared::Ready(PlannedCharge {
            id: ChargeId::from_uuid(owner.fence.generation),
            tenant: TenantId::new(owner.scope.tenant.clone()),
            request: request.clone(),
        }))
    }

    async fn effect(
        &self,
        planned: &PlannedCharge,
        effect_key: &str,
    ) -> Result<ProcessorCharge, EffectError> {
        let request = &planned.request;
        let call = ProcessorChargeRequest {
            idempotency_key: effect_key.to_owned(),
            money: request.money,
            source: request.source.clone(),
            metadata: ProcessorMetadata::charge(planned.tenant.clone(), planned.id),
        };
        let processor = &self.0.processor;
        match request.capture {
            CaptureMethod::Automatic => processor.charge(call).await,
            CaptureMethod::Manual => processor.authorize(call).await,
        }
        .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorCharge>, EffectError> {
        settled(self.0.processor.cancel(effect_key).await)
    }

    fn effect_id(charge: &ProcessorCharge) -> String {
        charge.id.clone()
    }

    fn confirms(charge: &ProcessorCharge, planned: &PlannedCharge) -> Result<(), String> {
        charge
            .confirms_as(planned.request.capture, planned.request.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        ApiError::CardDeclined(Decline::new(code, message)).to_stored_response()
    }

    /// The charge, its ledger transaction and its event, in one statement: a batch of one.
    async fn finish(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        planned: &PlannedCharge,
        processor_charge_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let (charge, response) = self.rows(owner, planned, processor_charge_id)?;
        self.write_rows(transaction, &[&charge]).await?;
        Ok(response)
    }
}

/// Concurrent charges finish together on PostgreSQL: a batch's charges, ledger transactions
/// and events in one statement, in one transaction with their records.
#[async_trait]
impl FinishesInBatches for CreateCharge {
    type Rows = Charge;

    fn rows(
        &self,
        _: Owner<'_>,
        planned: &PlannedCharge,
        processor_charge_id: String,
    ) -> Result<(Charge, StoredResponse), ProtocolError> {
        let request = &planned.request;
        let created_at = now_to_the_microsecond();
        let capture = match request.capture {
            CaptureMethod::Automatic => Capture::Automatic,
            CaptureMethod::Manual => Capture::held_until(
                created_at
                    + TimeDelta::from_std(self.0.authorization_window)
                        .map_err(|e| ProtocolError::Internal(e.into()))?,
            ),
        };
        let charge = Charge {
            id: planned.id,
            tenant: planned.tenant.clone(),
            money: request.money,
            source: request.source.clone(),
            description: request.description.clone(),
            processor_charge_id,
            created_at,
            amount_refunded: 0,
            capture,
        };
        let response = created_response(&charge)?;
        if failpoint::fails(Failure::Finish) {
            return Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut).into());
        }
        Ok((charge, response))
    }

    async fn write_rows(
        &self,
        transaction: &mut Transaction,
        charges: &[&Charge],
    ) -> Result<(), ProtocolError> {
        // Holds are written one at a time: a batch statement writes charges captured at once.
        let (captured, held): (Vec<&Charge>, Vec<&Charge>) = charges
            .iter()
            .partition(|charge| charge.capture == Capture::Automatic);
        match captured.as_slice() {
            [] => {}
            [charge] => self.0.store.insert_charge(transaction, charge).await?,
            _ => self.0.store.insert_charges(transaction, &captured).await?,
        }
        for charge in held {
            captures::insert_hold(transaction, charge).await?;
        }
        failpoint::in_batch_of_finishes(charges.len());
        Ok(())
    }
}

/// The 201 response of a charge. The bench floor `POST /bench/charge-2` stores the same.
pub(crate) fn created_response(charge: &Charge) -> Result<StoredResponse, ProtocolError> {
    created(
        &ChargeView::from(charge),
        &format!("/charges/{}", charge.id),
    )
}

/// PostgreSQL keeps microseconds: truncating first makes a charge (or a refund) read back
/// identical.
pub(crate) fn now_to_the_microsecond() -> DateTime<Utc> {
    let now = Utc::now();
    now.duration_trunc(TimeDelta::microseconds(1))
        .unwrap_or(now)
}

/// The charge's routes.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/charges", get(list).post(create))
        .route("/charges/{id}", get(show))
}

/// Everything is validated before the claim: a bad request stores nothing and leaves the key
/// free for a corrected request.
async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let validate = || async { Ok((CreateChargeBody::parse(&body)?, json_body(&body)?)) };
    run_idempotent(&state, &state.operations.charges, call, &body, validate).await
}

async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ChargeView>, ApiError> {
    let charge = tenants_charge(&state, &tenant, id).await?;
    Ok(Json(ChargeView::from(&charge)))
}

/// The tenant's charge the path names, or 404.
pub(super) async fn tenants_charge(
    state: &AppState,
    tenant: &TenantId,
    id: Result<Path<String>, PathRejection>,
) -> Result<Charge, ApiError> {
    tenants(id, "charge", |id: ChargeId| {
        state.store.get_charge(tenant, id)
    })
    .await
}

async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List<ChargeView>>, ApiError> {
    let read = |limit, starting_after| {
        let page = ListCharges {
            limit,
            starting_after,
        };
        state.store.list_charges(&tenant, page)
    };
    let page = params.page("charge", read).await?;
    Ok(Json(List::of(&page.charges, page.has_more)))
}

/// The body of `POST /charges`. Unknown fields are rejected so a typo (`ammount`) is an error,
/// not a silently different charge.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateChargeBody {
    pub amount: i64,
    pub currency: String,
    pub source: String,
    #[serde(default)]
    pub description: Option<String>,
    /// `false` only authorises: the charge holds its money until it is captured
    /// (`POST /charges/{id}/capture`) or canceled. Absent or `true` captures at once; `null`
    /// is refused rather than read as either.
    #[serde(default, deserialize_with = "crate::views::present")]
    pub capture: Option<bool>,
}

impl CreateChargeBody {
    /// The validated request in a `POST /charges` body: by the handler before the claim, and
    /// by the completer from the canonical body stored with a record.
    pub fn parse(body: &[u8]) -> Result<ChargeRequest, ApiError> {
        let typed: Self = json_body(body)?;
        ChargeRequest::try_from(typed)
    }

    /// `request` as the body every version of `charges.create` shares, whatever the client's
    /// spelling (`"USD"` or `"usd"`, `"description": null` or none): what its fingerprint
    /// covers, and what is stored for the completer, which [`parse`](Self::parse) reads back.
    pub(crate) fn canonical(request: &ChargeRequest) -> Value {
        let mut body = money_json(&request.money);
        body.insert("source".into(), request.source.as_str().into());
        insert_description(&mut body, request.description.as_ref());
        // Only a hold names its capture: a charge captured at once keeps the canonical body
        // (and so the fingerprint) it had before holds existed, whichever build computes it.
        if request.capture == CaptureMethod::Manual {
            body.insert("capture".into(), false.into());
        }
        Value::Object(body)
    }
}

impl TryFrom<CreateChargeBody> for ChargeRequest {
    type Error = ApiError;

    fn try_from(body: CreateChargeBody) -> Result<Self, Self::Error> {
        let money = money_field(body.amount, &body.currency)?;
        let source = PaymentSource::new(body.source).map_err(|e| match e {
            SourceError::CardNumber => card_number("source", &e),
            SourceError::NotAToken => invalid_field("source", &e),
        })?;
        let capture = match body.capture {
            Some(false) => CaptureMethod::Manual,
            Some(true) | None => CaptureMethod::Automatic,
        };
        Ok(ChargeRequest {
            money,
            source,
            description: description_field(body.description)?,
            capture,
        })
    }
}

/// A charge as the API shows it, in `POST /charges`, `GET /charges/{id}` and lists alike.
#[derive(Debug, Serialize)]
pub(crate) struct ChargeView {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub currency: &'static str,
    pub source: String,
    pub description: Option<String>,
    pub status: &'static str,
    pub processor_charge_id: String,
    /// RFC 3339 in UTC with microseconds, the precision the database keeps, so a charge reads
    /// back exactly as it was first returned.
    pub created_at: String,
    /// The sum of the charge's succeeded refunds: 0 in the 201 and its replays, which are the
    /// bytes of the moment the charge was made.
    pub amount_refunded: i64,
    /// The fields of a hold (a charge made with `"capture": false`), absent from a charge
    /// captured at once, whose view is what it was before holds existed, byte for byte.
    #[serde(flatten)]
    pub hold: Option<HoldView>,
}

/// What a hold shows beside the charge's own fields, as Stripe names them.
#[derive(Debug, Serialize)]
pub(crate) struct HoldView {
    /// Whether its money was taken.
    pub captured: bool,
    /// What a capture may still take: the whole amount while held, else 0.
    pub amount_capturable: i64,
    /// What its capture took; 0 until then, and for good once canceled.
    pub amount_captured: i64,
    /// RFC 3339: after it, the hold can no longer be captured, and is canceled.
    pub capture_before: String,
    /// Why it was canceled, once it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancellation_reason: Option<&'static str>,
}

impl HoldView {
    fn of(charge: &Charge) -> Option<Self> {
        let Capture::Manual {
            capture_before,
            state,
        } = charge.capture
        else {
            return None;
        };
        let cancellation_reason = match state {
            ManualCapture::Canceled { reason } => reason.map(|r| r.name()),
            _ => None,
        };
        Some(Self {
            captured: matches!(state, ManualCapture::Captured { .. }),
            amount_capturable: charge.amount_capturable(),
            amount_captured: charge
                .money_captured()
                .map_or(0, |money| money.amount.minor_units()),
            capture_before: timestamp(capture_before),
            cancellation_reason,
        })
    }
}

impl From<&Charge> for ChargeView {
    fn from(charge: &Charge) -> Self {
        Self {
            id: charge.id.to_string(),
            object: "charge",
            amount: charge.money.amount.minor_units(),
            currency: charge.money.currency.code(),
            source: charge.source.as_str().to_owned(),
            description: charge.description.as_ref().map(|d| d.as_str().to_owned()),
            status: charge.capture.status(),
            processor_charge_id: charge.processor_charge_id.clone(),
            created_at: timestamp(charge.created_at),
            amount_refunded: charge.amount_refunded,
            hold: HoldView::of(charge),
        }
    }
}
