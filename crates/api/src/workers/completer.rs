//! The completer: drives abandoned pending records to an end without their client.
//!
//! It asks the processor whether a charge exists under the record's processor key and never
//! creates one: found, it finishes the charge exactly as the request would have; not found, it
//! marks the record failed so that the client's next retry executes again.

use payments_domain::{ChargeRequest, TenantId};
use payments_idempotency::RecoveryPoint;
use payments_storage::{Abandoned, Finish};

use crate::charge_flow::{Owner, finish_charge};
use crate::views::CreateChargeBody;
use crate::{AppState, error_chain, metrics};

pub async fn run_round(state: &AppState, batch: i64) {
    let abandoned = match state.store.take_over_abandoned(batch).await {
        Ok(abandoned) => abandoned,
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "completer: cannot read abandoned records");
            return;
        }
    };
    for record in abandoned {
        if let Err(error) = complete_one(state, &record).await {
            // The record keeps its new lock; when that expires, a later round tries again.
            tracing::warn!(idempotency.key = %record.key, error = %error, "completer: record left pending");
        }
    }
}

async fn complete_one(state: &AppState, record: &Abandoned) -> Result<(), String> {
    let fail = |e: &dyn std::error::Error| error_chain(e);
    let Some(request) = stored_request(record) else {
        // Without the request the charge cannot be written; failing the record lets the
        // client's retry (which carries the request) finish it.
        state
            .store
            .mark_failed(&record.scope, &record.key, record.attempt)
            .await
            .map_err(|e| fail(&e))?;
        return Ok(());
    };
    let processor_charge_id = match (record.recovery_point, &record.processor_charge_id) {
        (RecoveryPoint::Charged | RecoveryPoint::Finished, Some(id)) => id.clone(),
        _ => match state
            .processor
            .find_charge(&record.processor_key)
            .await
            .map_err(|e| fail(&e))?
        {
            Some(charge) => charge.id,
            None => {
                state
                    .store
                    .mark_failed(&record.scope, &record.key, record.attempt)
                    .await
                    .map_err(|e| fail(&e))?;
                metrics::outcome("failed_by_completer");
                tracing::info!(idempotency.key = %record.key, "completer: no charge at the processor; record failed");
                return Ok(());
            }
        },
    };
    let owner = Owner {
        scope: &record.scope,
        key: &record.key,
        attempt: record.attempt,
        resource_id: record.resource_id,
    };
    let tenant = TenantId::new(record.scope.tenant.clone());
    let (finish, _) = finish_charge(state, owner, &tenant, &request, processor_charge_id)
        .await
        .map_err(|e| fail(&e))?;
    if finish == Finish::Written {
        metrics::outcome("completed_by_completer");
        tracing::info!(idempotency.key = %record.key, "completer: charge finished");
    }
    Ok(())
}

/// The validated request stored with the record, if it is there and still valid.
fn stored_request(record: &Abandoned) -> Option<ChargeRequest> {
    let body: CreateChargeBody = serde_json::from_slice(record.request_body.as_deref()?).ok()?;
    ChargeRequest::try_from(body).ok()
}
