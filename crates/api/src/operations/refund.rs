//! `refunds.create`: refund part or all of a charge. The request is a [`RefundRequest`];
//! [`prepare`](Operation::prepare) reserves its amount on the charge, so refunds of one charge
//! under different keys never exceed it together; the effect is a [`ProcessorRefund`]; the
//! finish writes the succeeded refund, the charge's refunded amount, the reversing ledger
//! transaction and the `payment.refunded` event in the transaction the engine completes the
//! record in. A refund that definitively fails (declined, refused, or tombstoned by the
//! completer) releases its reservation in the transaction the engine ends its record in.
//!
//! The refund as a resource is here too: its routes (`POST /charges/{id}/refunds`,
//! `GET /charges/{id}/refunds`, `GET /refunds/{id}`), the body a client sends and the view it
//! reads back.

use async_trait::async_trait;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use payments_domain::{
    Amount, ChargeId, ProcessorMetadata, ProcessorRefund, ProcessorRefundRequest, Refund, RefundId,
    RefundReason, RefundRequest, RefundStatus,
};
use payments_idempotency::engine::{
    EffectError, FinishesInBatches, Operation, Owner, Prepared, Preparing, ProtocolError, Settled,
    Unmade,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_storage::{ListRefunds, RefundRefusal, Reservation, Transaction};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::charge::now_to_the_microsecond;
use super::charge::tenants_charge;
use super::hold::HoldRefusal;
use super::{Ports, SCHEMA_VERSION, created, effect_error, settled};
use crate::extract::{ApiQuery, IdempotentCall, JsonBytes, Tenant};
use crate::failpoint;
use crate::handling::{ListParams, run_idempotent, tenants};
use crate::views::{List, invalid_field, joined_stored, json_body, split_stored, timestamp};
use crate::{ApiError, AppState, Decline};

/// Refunding a charge: the card processor is its effect port, and the store holds its
/// reservation, refund, ledger and outbox rows.
#[derive(Debug)]
pub(crate) struct CreateRefund(pub Ports);

/// A refund reserved on its charge, ready for the processor.
#[derive(Debug)]
pub(crate) struct ReservedRefund {
    /// The pending refund: its id is the record's generation, its amount the one reserved.
    refund: Refund,
    /// The processor's id of the charge to refund.
    processor_charge_id: String,
}

#[async_trait]
impl Operation for CreateRefund {
    type Request = RefundRequest;
    type Plan = ReservedRefund;
    type Effect = ProcessorRefund;
    type Transaction = Transaction;

    const FAMILY: &'static str = "refunds.create";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "refund";
    const ROUTE: (&'static str, &'static str) = ("POST", "/charges/{id}/refunds");

    fn canonical_request(request: &RefundRequest) -> serde_json::Value {
        CreateRefundBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<RefundRequest> {
        CreateRefundBody::parse_stored(body).ok()
    }

    /// Reserves the amount (all that is left when none was asked for) on the charge, or
    /// answers for good when the charge cannot give it.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &RefundRequest,
    ) -> Result<Prepared<ReservedRefund>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let reservation = self
            .0
            .store
            .reserve_refund(transaction, owner, request, now_to_the_microsecond())
            .await?;
        let refused = |error: ApiError| Ok(Prepared::Refused(error.to_stored_response()));
        match reservation {
            Reservation::Reserved {
                refund,
                processor_charge_id,
            } => Ok(Prepared::Ready(ReservedRefund {
                refund,
                processor_charge_id,
            })),
            Reservation::Refused(RefundRefusal::TooLarge { refundable }) => {
                refused(ApiError::RefundAmountTooLarge { refundable })
            }
            Reservation::Refused(RefundRefusal::NothingLeft) => {
                refused(ApiError::ChargeAlreadyRefunded)
            }
            Reservation::Refused(RefundRefusal::NotCaptured) => {
                Ok(Prepared::Refused(HoldRefusal::not_captured().stored()))
            }
            Reservation::Refused(RefundRefusal::InsufficientBalance { available }) => {
                refused(ApiError::InsufficientBalance { available })
            }
            Reservation::Refused(RefundRefusal::NoSuchCharge) => refused(ApiError::NotFound(
                format!("No such charge: {}", request.charge),
            )),
        }
    }

    async fn effect(
        &self,
        reserved: &ReservedRefund,
        effect_key: &str,
    ) -> Result<ProcessorRefund, EffectError> {
        self.0
            .processor
            .refund(ProcessorRefundRequest {
                idempotency_key: effect_key.to_owned(),
                processor_charge_id: reserved.processor_charge_id.clone(),
                money: reserved.refund.money,
                metadata: ProcessorMetadata::refund(
                    reserved.refund.tenant.clone(),
                    reserved.refund.id,
                ),
            })
            .await
            .map_err(effect_error)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<ProcessorRefund>, EffectError> {
        settled(self.0.processor.cancel_refund(effect_key).await)
    }

    fn effect_id(refund: &ProcessorRefund) -> String {
        refund.id.clone()
    }

    fn confirms(refund: &ProcessorRefund, reserved: &ReservedRefund) -> Result<(), String> {
        refund
            .confirms(&reserved.processor_charge_id, reserved.refund.money)
            .map_err(|e| e.to_string())
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        ApiError::RefundDeclined(Decline::new(code, message)).to_stored_response()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        reserved: &ReservedRefund,
        processor_refund_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let (refund, response) = self.rows(owner, reserved, processor_refund_id)?;
        self.write_rows(transaction, &[&refund]).await?;
        Ok(response)
    }

    /// The reservation goes with the record.
    async fn end_unmade(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        _: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        Ok(self.0.store.release_refund(transaction, owner).await?)
    }
}

/// Concurrent refunds finish together on PostgreSQL: each refund's statements (`finish`'s), in
/// one transaction with the batch's records, and one commit for the batch.
#[async_trait]
impl FinishesInBatches for CreateRefund {
    type Rows = Refund;

    fn rows(
        &self,
        _: Owner<'_>,
        reserved: &ReservedRefund,
        processor_refund_id: String,
    ) -> Result<(Refund, StoredResponse), ProtocolError> {
        let refund = reserved.refund.succeeded(processor_refund_id);
        let response = created(
            &RefundView::from(&refund),
            &format!("/refunds/{}", refund.id),
        )?;
        Ok((refund, response))
    }

    /// Refunds of one charge in a batch add to its refunded amount one after the other, in
    /// the batch's order.
    async fn write_rows(
        &self,
        transaction: &mut Transaction,
        refunds: &[&Refund],
    ) -> Result<(), ProtocolError> {
        self.0.store.finish_refunds(transaction, refunds).await?;
        failpoint::in_batch_of_finishes(refunds.len());
        Ok(())
    }
}

/// The refund's routes.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/charges/{id}/refunds", get(list).post(create))
        .route("/refunds/{id}", get(show))
}

/// Everything is validated before the claim, the charge too: a bad request or a charge that is
/// not the tenant's stores nothing and leaves the key free.
async fn create(
    State(state): State<AppState>,
    call: IdempotentCall,
    id: Result<Path<String>, PathRejection>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let tenant = call.tenant.clone();
    let validate = || async {
        let charge = tenants_charge(&state, &tenant, id).await?;
        let request = CreateRefundBody::parse(&body, charge.id)?;
        // The stored request names the charge, so that the fingerprint covers it and the
        // completer can finish the refund from the record alone.
        let stored = joined_stored(&body, CreateRefundBody::CHARGE, charge.id)?;
        Ok((request, stored))
    };
    run_idempotent(&state, &state.operations.refunds, call, &body, validate).await
}

async fn show(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<RefundView>, ApiError> {
    let find = |id: RefundId| state.store.get_refund(&tenant, id);
    let refund = tenants(id, "refund", find).await?;
    Ok(Json(RefundView::from(&refund)))
}

async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    id: Result<Path<String>, PathRejection>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<List<RefundView>>, ApiError> {
    let charge = tenants_charge(&state, &tenant, id).await?;
    let read = |limit, starting_after| {
        let page = ListRefunds {
            charge: charge.id,
            limit,
            starting_after,
        };
        state.store.list_refunds(&tenant, page)
    };
    let page = params.page("refund", read).await?;
    Ok(Json(List::of(&page.refunds, page.has_more)))
}

/// The body of `POST /charges/{id}/refunds`. Unknown fields are rejected, like a charge's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRefundBody {
    #[serde(default, deserialize_with = "crate::views::present")]
    pub amount: Option<i64>,
    #[serde(default, deserialize_with = "crate::views::present")]
    pub reason: Option<String>,
}

impl CreateRefundBody {
    /// The field naming the charge in the stored request.
    pub(crate) const CHARGE: &'static str = "charge";

    /// The validated refund of `charge` in a `POST /charges/{id}/refunds` body.
    pub(crate) fn parse(body: &[u8], charge: ChargeId) -> Result<RefundRequest, ApiError> {
        let typed: Self = json_body(body)?;
        typed.into_request(charge)
    }

    /// The request stored with a record, for the completer: the body with the charge of the
    /// path as its [`CHARGE`](Self::CHARGE) field.
    pub(crate) fn parse_stored(body: &[u8]) -> Result<RefundRequest, ApiError> {
        let (charge, typed): (ChargeId, Self) = split_stored(body, Self::CHARGE)?;
        typed.into_request(charge)
    }

    /// `request` as the body every version of `refunds.create` shares, the charge of the path
    /// included (see [`CreateChargeBody::canonical`]); [`parse_stored`](Self::parse_stored)
    /// reads it back.
    pub(crate) fn canonical(request: &RefundRequest) -> Value {
        let mut body = serde_json::Map::new();
        body.insert(Self::CHARGE.into(), request.charge.to_string().into());
        if let Some(amount) = request.amount {
            body.insert("amount".into(), amount.minor_units().into());
        }
        if let Some(reason) = request.reason {
            body.insert("reason".into(), reason.name().into());
        }
        Value::Object(body)
    }

    fn into_request(self, charge: ChargeId) -> Result<RefundRequest, ApiError> {
        let amount = self
            .amount
            .map(Amount::new)
            .transpose()
            .map_err(|e| invalid_field("amount", &e))?;
        let reason = self
            .reason
            .map(|name| {
                RefundReason::from_name(&name).ok_or_else(|| {
                    let names: Vec<_> = RefundReason::ALL.iter().map(|r| r.name()).collect();
                    invalid_field("reason", &format!("must be one of {}", names.join(", ")))
                })
            })
            .transpose()?;
        Ok(RefundRequest {
            charge,
            amount,
            reason,
        })
    }
}

/// A refund as the API shows it, in its 201, `GET /refunds/{id}` and lists alike.
#[derive(Debug, Serialize)]
pub(crate) struct RefundView {
    pub id: String,
    pub object: &'static str,
    pub charge: String,
    pub amount: i64,
    pub currency: &'static str,
    pub status: &'static str,
    pub reason: Option<&'static str>,
    /// `None` while the refund is pending at the processor.
    pub processor_refund_id: Option<String>,
    pub created_at: String,
}

impl From<&Refund> for RefundView {
    fn from(refund: &Refund) -> Self {
        let (status, processor_refund_id) = match &refund.status {
            RefundStatus::Pending => ("pending", None),
            RefundStatus::Succeeded {
                processor_refund_id,
            } => ("succeeded", Some(processor_refund_id.clone())),
        };
        Self {
            id: refund.id.to_string(),
            object: "refund",
            charge: refund.charge.to_string(),
            amount: refund.money.amount.minor_units(),
            currency: refund.money.currency.code(),
            status,
            reason: refund.reason.map(RefundReason::name),
            processor_refund_id,
            created_at: timestamp(refund.created_at),
        }
    }
}
