//! `payouts.create`: pay part of the tenant's balance out to one of its bank accounts. The
//! request is a [`PayoutRequest`]; [`prepare`](Operation::prepare) reserves its amount on the
//! tenant's balance, so payouts and refunds under different keys never take it below zero
//! together; the effect is a [`ProcessorPayout`]; the finish writes the paid payout, its ledger
//! transaction and the `payout.paid` event in the transaction the engine completes the record
//! in. A payout that definitively fails (declined, refused, or tombstoned by the completer)
//! releases its reservation in the transaction the engine ends its record in.
//!
//! The payout as a resource is here too: its routes (`POST /payouts`, `GET /payouts/{id}`,
//! `GET /payouts`, and `GET /balance`, what payouts may take), the body a client sends and the
//! views it reads back.

use async_trait::async_trait;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use payments_domain::{
    Destination, DestinationError, Payout, PayoutId, PayoutRequest, PayoutStatus,
    ProcessorMetadata, ProcessorPayout, ProcessorPayoutRequest,
};
use payments_idempotency::engine::{
    EffectError, FinishesInBatches, Operation, Owner, Prepared, Preparing, ProtocolError, Settled,
    Unmade,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{Funds, ListPayouts, PayoutReservation, Transaction};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::charge::now_to_the_microsecond;
use super::{Ports, SCHEMA_VERSION, created, effect_error, settled};
use crate::extract::{ApiQuery, IdempotentCall, JsonBytes, Tenant};
use crate::failpoint;
use crate::handling::{ListParams, run_idempotent, tenants};
use crate::views::{
    List, card_number, description_field, insert_description, invalid_field, json_body,
    money_field, money_json, timestamp,
};
use crate::{ApiError, AppState, Decline};

/// Paying out: the processor's payouts are its effect port, and the store holds its
/// reservation, payout, ledger and outbox rows.
#[derive(Debug)]
pub(crate) struct CreatePayout(pub Ports);

#[async_trait]
impl Operation for CreatePayout {
    type Request = PayoutRequest;
    /// The pending payout: its id is the record's generation, its amount the one reserved.
    type Plan = Payout;
    type Effect = ProcessorPayout;
    type Transaction = Transaction;

    const FAMILY: &'static str = "payouts.create";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "payout";
    const ROUTE: (&'static str, &'static str) = ("POST", "/payouts");

    fn canonical_request(request: &PayoutRequest) -> serde_json::Value {
        CreatePayoutBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<PayoutRequest> {
        CreatePayoutBody::parse(body).ok()
    }

    /// Reserves the amount on the tenant's balance, or answers for good when the balance
    /// cannot give it.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &PayoutRequest,
    ) -> Result<Prepared<Payout>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let reservation = self
            .0
            .store
            .reserve_payout(transaction, owner, request, now_to_the_microsecond())
            .await?;
        Ok(match reservation {
            PayoutReservation::Reserved(payout) => Prepared::Ready(payout),
            PayoutReservation::InsufficientBalance { available } => {
                Prepared::Refused(ApiError::InsufficientBalance { available }.to_stored_response())
            }
        })
    }

    async fn effect(
        &self,
        payout: &Payout,
        effect_key: &str,
    ) -> Result<ProcessorPayout, EffectError> {
        self.0
            .processor
            .payout(ProcessorPayoutRequest {
                idempotency_key: effect_key.to_owned(),
                money: payout.money,
                destination: payout.destination.clone(),
                metadata: ProcessorMetadata::payout(payout.tenant.clone(), payout.id),
            })
            .await
            .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorPayout>, EffectError> {
        settled(self.0.processor.cancel_payout(effect_key).await)
    }

    fn effect_id(payout: &ProcessorPayout) -> String {
        payout.id.clone()
    }

    fn confirms(reported: &ProcessorPayout, payout: &Payout) -> Result<(), String> {
        reported
            .confirms(&payout.destination, payout.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        ApiError::PayoutDeclined(Decline::new(code, message)).to_stored_response()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        pending: &Payout,
        processor_payout_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let (payout, response) = self.rows(owner, pending, processor_payout_id)?;
        self.write_rows(transaction, &[&payout]).await?;
        Ok(response)
    }

    /// The reservation goes with the record.
    async fn end_unmade(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        _: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        Ok(self.0.store.release_payout(transaction, owner).await?)
    }
}

/// Concurrent payouts finish together on PostgreSQL: each payout's statements (`finish`'s), in
/// one transaction with the batch's records, and one commit for the batch.
#[async_trait]
impl FinishesInBatches for CreatePayout {
    type Rows = Payout;

    fn rows(
        &self,
        _: Owner<'_>,
        pending: &Payout,
        processor_payout_id: String,
    ) -> Result<(Payout, StoredResponse), ProtocolError> {
        let payout = pending.paid(processor_payout_id);
        let response = created(
            &PayoutView::from(&payout),
            &format!("/payouts/{}", payout.id),
        )?;
        Ok((payout, response))
    }

    async fn write_rows(
        &self,
        transaction: &mut Transaction,
        payouts: &[&Payout],
    ) -> Result<(), ProtocolError> {
        self.0.store.finish_payouts(transaction, payouts).await?;
        failpoint::in_batch_of_finishes(payouts.len());
        Ok(())
    }
}

/// The payout's routes, and the balance's.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/payouts", get(list).post(create))
        .route("/payouts/{id}", get(show))
        .route("/balance", get(balance))
}

/// Everything is validated before the claim: a bad request stores nothing and leaves the key
/// free for a corrected request. The balance is judged after the claim, under its lock.
async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let validate = || async { Ok((CreatePayoutBody::parse(&body)?, json_body(&body)?)) };
    run_idempotent(&state, &state.operations.payouts, call, &body, validate).await
}

async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<PayoutView>, ApiError> {
    let find = |id: PayoutId| state.store.get_payout(&tenant, id);
    let payout = tenants(id, "payout", find).await?;
    Ok(Json(PayoutView::from(&payout)))
}

async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List<PayoutView>>, ApiError> {
    let read = |limit, starting_after| {
        let page = ListPayouts {
            limit,
            starting_after,
        };
        state.store.list_payouts(&tenant, page)
    };
    let page = params.page("payout", read).await?;
    Ok(Json(List::of(&page.payouts, page.has_more)))
}

/// What the tenant may pay out or refund now, and what its payouts in flight hold.
async fn balance(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<Json<FundsView>, ApiError> {
    let funds = state.store.funds(&tenant).await?;
    Ok(Json(FundsView::of(&funds)))
}

/// The body of `POST /payouts`. Unknown fields are rejected, like a charge's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreatePayoutBody {
    pub amount: i64,
    pub currency: String,
    pub destination: String,
    #[serde(default)]
    pub description: Option<String>,
}

impl CreatePayoutBody {
    /// The validated request in a `POST /payouts` body: by the handler before the claim, and
    /// by the completer from the canonical body stored with a record.
    pub(crate) fn parse(body: &[u8]) -> Result<PayoutRequest, ApiError> {
        let typed: Self = json_body(body)?;
        let destination = Destination::new(typed.destination).map_err(|e| match e {
            DestinationError::CardNumber => card_number("destination", &e),
            DestinationError::NotABankAccount => invalid_field("destination", &e),
        })?;
        Ok(PayoutRequest {
            money: money_field(typed.amount, &typed.currency)?,
            destination,
            description: description_field(typed.description)?,
        })
    }

    /// `request` as the body every version of `payouts.create` shares (see
    /// [`CreateChargeBody::canonical`]); [`parse`](Self::parse) reads it back.
    pub(crate) fn canonical(request: &PayoutRequest) -> Value {
        let mut body = money_json(&request.money);
        body.insert("destination".into(), request.destination.as_str().into());
        insert_description(&mut body, request.description.as_ref());
        Value::Object(body)
    }
}

/// A payout as the API shows it, in its 201, `GET /payouts/{id}` and lists alike.
#[derive(Debug, Serialize)]
pub(crate) struct PayoutView {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub currency: &'static str,
    pub destination: String,
    pub description: Option<String>,
    pub status: &'static str,
    /// `None` while the payout is pending at the processor.
    pub processor_payout_id: Option<String>,
    pub created_at: String,
}

impl From<&Payout> for PayoutView {
    fn from(payout: &Payout) -> Self {
        let (status, processor_payout_id) = match &payout.status {
            PayoutStatus::Pending => ("pending", None),
            PayoutStatus::Paid {
                processor_payout_id,
            } => ("paid", Some(processor_payout_id.clone())),
        };
        Self {
            id: payout.id.to_string(),
            object: "payout",
            amount: payout.money.amount.minor_units(),
            currency: payout.money.currency.code(),
            destination: payout.destination.as_str().to_owned(),
            description: payout.description.as_ref().map(|d| d.as_str().to_owned()),
            status,
            processor_payout_id,
            created_at: timestamp(payout.created_at),
        }
    }
}

/// `GET /balance`: the tenant's funds per currency, in the shape payment APIs commonly use.
#[derive(Debug, Serialize)]
pub(crate) struct FundsView {
    pub object: &'static str,
    /// What payouts and refunds may take now.
    pub available: Vec<AmountView>,
    /// What payouts in flight hold; only currencies in which some are.
    pub pending: Vec<AmountView>,
    /// What holds (charges made with `"capture": false`) have on cards, not yet captured or
    /// canceled: never available, never pending; only currencies in which some are, and absent
    /// when there are none, so that a tenant without holds reads the balance it always read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub authorized: Vec<AmountView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AmountView {
    pub amount: i64,
    pub currency: &'static str,
}

impl FundsView {
    pub(crate) fn of(funds: &[Funds]) -> Self {
        let amounts = |amount: fn(&Funds) -> i64| -> Vec<AmountView> {
            funds
                .iter()
                .map(|f| AmountView {
                    amount: amount(f),
                    currency: f.currency.code(),
                })
                .collect()
        };
        Self {
            object: "balance",
            available: amounts(|f| f.available),
            pending: amounts(|f| f.pending)
                .into_iter()
                .filter(|a| a.amount != 0)
                .collect(),
            authorized: amounts(|f| f.authorized)
                .into_iter()
                .filter(|a| a.amount != 0)
                .collect(),
        }
    }
}
