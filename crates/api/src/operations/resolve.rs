//! `exceptions.resolve`: an operator resolves a reconciliation exception. The request is a
//! [`ResolutionRequest`]; [`prepare`](Operation::prepare) holds the exception for the record's
//! generation, so resolutions under other keys change nothing; the effect is the action's at
//! the processor:
//! - `record`: the processor confirms the charge under the key it reported (a lookup, never a
//!   charge), and the finish posts it as a charge's finish does: the charge, its ledger
//!   transaction and its `payment.completed` event;
//! - `void`: a refund of all the processor charged, under the resolution's own effect key; the
//!   finish keeps it in the books, and ends the pending record a mismatch held with
//!   `402 charge_voided`;
//! - `accept`: nothing.
//!
//! Every finish also writes the resolution (the operator, the time, the note) and marks the
//! exception resolved, in the transaction that completes the record. The answer is the
//! resolved exception.
//!
//! The completer settles an abandoned resolution through the refund key: a void's refund is
//! found and finished, and a `record` or `accept`, which never makes anything under that key,
//! finds the key tombstoned and fails, so the operator's retry runs it afresh.

use async_trait::async_trait;
use payments_domain::{
    Charge, ChargeId, ItemResult, Money, PaymentSource, ProcessorCharge, ProcessorMetadata,
    ProcessorRefund, ProcessorRefundRequest, ResolutionAction, ResolutionRequest, TenantId,
};
use payments_idempotency::engine::{
    EffectError, Operation, Owner, Prepared, Preparing, ProtocolError, Settled, Unmade,
};
use payments_idempotency::{IdempotencyKey, SchemaVersion, Scope, StoredResponse};
use payments_storage::{
    ExceptionHold, ExceptionStatus, HeldEnd, NewResolution, Posting, ReconciliationException,
    Resolution, Transaction,
};

use super::charge::now_to_the_microsecond;
use super::{Ports, SCHEMA_VERSION, effect_error, ok, settled};
use crate::views::{ExceptionView, ResolveBody};
use crate::{ApiError, Decline};

/// Resolving an exception: the card processor is its effect port, and the store holds the
/// exception, the resolution and what it posts.
#[derive(Debug)]
pub(crate) struct ResolveException(pub Ports);

/// A resolution ready for the processor: the request, who asked, and the exception it holds.
#[derive(Debug)]
pub(crate) struct PlannedResolution {
    request: ResolutionRequest,
    operator: String,
    exception: ReconciliationException,
}

impl PlannedResolution {
    /// The processor's key and money of the exception; `None` for one the processor did not
    /// report, which no action but `accept` fits.
    fn processor_line(&self) -> Result<(&str, Money), ProtocolError> {
        self.exception
            .processor
            .as_ref()
            .map(|line| (line.processor_key.as_str(), line.money))
            .ok_or_else(|| internal("the exception has no processor line to act on"))
    }
}

/// What the processor did for a resolution.
#[derive(Debug)]
pub(crate) enum ResolutionEffect {
    /// `record`: the charge it confirmed.
    Confirmed(ProcessorCharge),
    /// `void`: the refund that gave the charge back.
    Voided(ProcessorRefund),
    /// `accept`: nothing.
    Nothing,
}

/// The effect id `accept` leaves if its finish fails: it made nothing at the processor.
const NOTHING: &str = "nothing";

#[async_trait]
impl Operation for ResolveException {
    type Request = ResolutionRequest;
    type Plan = PlannedResolution;
    type Effect = ResolutionEffect;
    type Transaction = Transaction;

    const FAMILY: &'static str = "exceptions.resolve";
    const VERSION: SchemaVersion = SCHEMA_VERSION;
    const EFFECT: &'static str = "resolution";
    const ROUTE: (&'static str, &'static str) = ("POST", "/ops/exceptions/{id}/resolve");

    fn canonical_request(request: &ResolutionRequest) -> serde_json::Value {
        ResolveBody::canonical(request)
    }

    fn stored_request(&self, body: &[u8]) -> Option<ResolutionRequest> {
        ResolveBody::parse_stored(body).ok()
    }

    /// Holds the exception, or answers for good when it is resolved or being resolved.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        request: &ResolutionRequest,
    ) -> Result<Prepared<PlannedResolution>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let hold = self
            .0
            .store
            .hold_exception(transaction, owner, request.exception)
            .await?;
        let refused = |error: ApiError| Ok(Prepared::Refused(error.to_stored_response()));
        match hold {
            ExceptionHold::Held(exception) => Ok(Prepared::Ready(PlannedResolution {
                request: request.clone(),
                // The record's scope is the operator's: its keys are the operator's own.
                operator: owner.scope.tenant.clone(),
                exception: *exception,
            })),
            ExceptionHold::Resolved => refused(ApiError::ExceptionAlreadyResolved),
            ExceptionHold::HeldByAnother => refused(ApiError::ExceptionBeingResolved),
            ExceptionHold::Missing => refused(ApiError::NotFound(format!(
                "No such exception: {}",
                request.exception
            ))),
        }
    }

    async fn effect(
        &self,
        plan: &PlannedResolution,
        effect_key: &str,
    ) -> Result<ResolutionEffect, EffectError> {
        let processor = &self.0.processor;
        let line = plan.processor_line().map_err(|e| EffectError::Unavailable {
            reason: e.to_string(),
        });
        match plan.request.action {
            ResolutionAction::Accept => Ok(ResolutionEffect::Nothing),
            ResolutionAction::Record => {
                let (processor_key, _) = line?;
                match processor.find_charge(processor_key).await {
                    Ok(Some(charge)) => Ok(ResolutionEffect::Confirmed(charge)),
                    // The processor no longer knows the key (its key window passed): it
                    // cannot confirm, and nothing is posted unconfirmed.
                    Ok(None) => Err(EffectError::Declined {
                        code: "no_such_charge".into(),
                        message: "The processor does not confirm a charge under the reported key; \
                                  nothing was recorded."
                            .into(),
                    }),
                    Err(error) => Err(effect_error(error)),
                }
            }
            ResolutionAction::Void => {
                let (_, money) = line?;
                let tenant = plan
                    .exception
                    .tenant
                    .clone()
                    .unwrap_or_else(|| TenantId::new(""));
                processor
                    .refund(ProcessorRefundRequest {
                        idempotency_key: effect_key.to_owned(),
                        processor_charge_id: plan.exception.processor_id.clone(),
                        money,
                        metadata: ProcessorMetadata::new(tenant, plan.exception.id.to_string()),
                    })
                    .await
                    .map(ResolutionEffect::Voided)
                    .map_err(effect_error)
            }
        }
    }

    /// Only a void makes anything under the effect key; a cancel settles it either way.
    async fn settle(&self, effect_key: &str) -> Result<Settled<ResolutionEffect>, EffectError> {
        let answer = settled(self.0.processor.cancel_refund(effect_key).await)?;
        Ok(match answer {
            Settled::Exists(refund) => Settled::Exists(ResolutionEffect::Voided(refund)),
            Settled::StillProcessing => Settled::StillProcessing,
            Settled::Tombstoned => Settled::Tombstoned,
        })
    }

    fn effect_id(effect: &ResolutionEffect) -> String {
        match effect {
            ResolutionEffect::Confirmed(charge) => charge.id.clone(),
            ResolutionEffect::Voided(refund) => refund.id.clone(),
            ResolutionEffect::Nothing => NOTHING.to_owned(),
        }
    }

    /// A confirmed charge must be the reported one, for the reported money; a void must give
    /// all of it back.
    fn confirms(effect: &ResolutionEffect, plan: &PlannedResolution) -> Result<(), String> {
        let line = || plan.processor_line().map_err(|e| e.to_string());
        let processor_id = &plan.exception.processor_id;
        match (plan.request.action, effect) {
            (ResolutionAction::Accept, ResolutionEffect::Nothing) => Ok(()),
            (ResolutionAction::Record, ResolutionEffect::Confirmed(charge)) => {
                if &charge.id != processor_id {
                    return Err(format!(
                        "the processor confirmed {} under the key, the report named {processor_id}",
                        charge.id
                    ));
                }
                charge.confirms(line()?.1).map_err(|e| e.to_string())
            }
            (ResolutionAction::Void, ResolutionEffect::Voided(refund)) => refund
                .confirms(processor_id, line()?.1)
                .map_err(|e| e.to_string()),
            (action, effect) => Err(format!(
                "{} got another action's effect: {effect:?}",
                action.as_str()
            )),
        }
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        ApiError::ResolutionDeclined(Decline::new(code, message)).to_stored_response()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        plan: &PlannedResolution,
        effect_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let exception = &plan.exception;
        let resolved_at = now_to_the_microsecond();
        let voided_response = ApiError::ChargeVoided.to_stored_response();
        let held = held_record(exception)?;
        let charge;
        let (posts, recorded_id, void_processor_id) = match plan.request.action {
            ResolutionAction::Accept => (Posting::Nothing, None, None),
            ResolutionAction::Record => {
                charge = recorded_charge(owner, plan, effect_id, resolved_at)?;
                (Posting::Charge(&charge), Some(charge.id.to_string()), None)
            }
            ResolutionAction::Void => {
                let held = held.as_ref().map(|(scope, key)| HeldEnd {
                    scope,
                    key,
                    response: &voided_response,
                });
                let posts = Posting::Void {
                    tenant: exception.tenant.as_ref(),
                    processor_id: &effect_id,
                    money: plan.processor_line()?.1,
                    held,
                };
                (posts, None, Some(effect_id.clone()))
            }
        };
        let resolution = Resolution {
            action: plan.request.action,
            operator: plan.operator.clone(),
            note: plan.request.note.as_str().to_owned(),
            resolved_at,
            recorded_id,
            void_processor_id,
        };
        let resolved = ReconciliationException {
            status: ExceptionStatus::Resolved,
            resolution: Some(resolution),
            ..exception.clone()
        };
        let response = ok(&ExceptionView::from(&resolved))?;
        let new = NewResolution {
            exception: exception.id,
            action: plan.request.action,
            operator: &plan.operator,
            note: &plan.request.note,
            resolved_at,
            posts,
        };
        self.0
            .store
            .finish_resolution(transaction, owner, &new)
            .await?;
        Ok(response)
    }

    /// The exception is let go with the record.
    async fn end_unmade(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        _: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        Ok(self.0.store.release_exception(transaction, owner).await?)
    }
}

/// The charge a `record` posts: the processor's, for the tenant and under the id its metadata
/// names (the request's own id, when the books lost it), or the resolution's id when it names
/// none. The report does not carry the card's token.
fn recorded_charge(
    owner: Owner<'_>,
    plan: &PlannedResolution,
    processor_charge_id: String,
    created_at: chrono::DateTime<chrono::Utc>,
) -> Result<Charge, ProtocolError> {
    let exception = &plan.exception;
    let tenant = exception
        .tenant
        .clone()
        .ok_or_else(|| internal("a charge to record names no tenant"))?;
    let id = exception
        .resource_id
        .as_deref()
        .and_then(|id| id.parse::<ChargeId>().ok())
        .unwrap_or_else(|| ChargeId::from_uuid(owner.fence.generation));
    let source = PaymentSource::new(UNREPORTED_SOURCE).map_err(|e| internal(&e.to_string()))?;
    Ok(Charge {
        id,
        tenant,
        money: plan.processor_line()?.1,
        source,
        description: None,
        processor_charge_id,
        created_at,
        amount_refunded: 0,
        capture: payments_domain::Capture::Automatic,
    })
}

/// The source of a recorded charge: the settlement report names no card token.
pub(crate) const UNREPORTED_SOURCE: &str = "tok_unreported";

/// The pending record a `processor_mismatch` holds, as its scope and key.
fn held_record(
    exception: &ReconciliationException,
) -> Result<Option<(Scope, IdempotencyKey)>, ProtocolError> {
    if exception.kind != ItemResult::ProcessorMismatch {
        return Ok(None);
    }
    let Some(record) = &exception.record else {
        return Ok(None);
    };
    let key = IdempotencyKey::parse(&record.key).map_err(|e| internal(&e.to_string()))?;
    let scope = Scope {
        tenant: record.tenant.as_str().to_owned(),
        operation: record.operation.clone(),
    };
    Ok(Some((scope, key)))
}

fn internal(reason: &str) -> ProtocolError {
    ProtocolError::Internal(reason.to_owned().into())
}
