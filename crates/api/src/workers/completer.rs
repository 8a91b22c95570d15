//! The completer: settles pending records whose attempt ended without an answer, on behalf of
//! a client that may never retry.
//!
//! It takes over one record at a time, and only once the record's lock ended at least
//! `processor.settle_after_ms` ago, so that any processor call made under that lock has
//! finished at the processor. Then it asks the processor for a definitive answer under the
//! record's processor key ([`CardProcessor::cancel`](payments_domain::CardProcessor::cancel)),
//! which never creates a charge:
//! - a charge exists: checked against the stored request, then finished exactly as the request
//!   would have finished it (charge, ledger, event and the stored 201, in one transaction);
//! - a call is still processing, or the processor cannot be reached: the record stays pending,
//!   released, and a later round asks again;
//! - none, and the key is now tombstoned: only then is the record failed, and the client's
//!   retry starts a new generation with a new processor key.
//!
//! "I could not find a charge" is never read as "there is no charge".

use payments_domain::{CancelOutcome, ChargeRequest, TenantId};
use payments_idempotency::RecoveryPoint;
use payments_storage::{Abandoned, Completion};
use tokio::sync::watch;

use super::{WorkerSettings, stopped};
use crate::charge_flow::{Owner, confirms, finish_charge};
use crate::views::CreateChargeBody;
use crate::{AppState, error_chain, metrics};

/// Settles up to `completer_batch` records, one at a time, and stops between records (or
/// abandons the one in hand) as soon as `shutdown` says so. A record abandoned mid-way is left
/// as a crash would leave it: pending under the completer's lock, fenced, and settled by
/// whoever takes it next.
pub async fn run_round(
    state: &AppState,
    settings: &WorkerSettings,
    shutdown: &mut watch::Receiver<bool>,
) {
    for _ in 0..settings.completer_batch {
        if *shutdown.borrow() {
            return;
        }
        let record = match state.store.take_over_abandoned(settings.settle_after).await {
            Ok(Some(record)) => record,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "completer: cannot take over a record");
                return;
            }
        };
        tokio::select! {
            settled = settle(state, &record) => {
                if let Err(error) = settled {
                    // The record keeps the completer's lock; a later round or a retry resumes it.
                    tracing::warn!(idempotency.key = %record.key, error = %error, "completer: record left pending");
                }
            }
            () = stopped(shutdown) => return,
        }
    }
}

async fn settle(state: &AppState, record: &Abandoned) -> Result<(), String> {
    let fail = |e: &dyn std::error::Error| error_chain(e);
    let scope = &record.scope;
    let key = &record.key;
    let fence = record.fence();
    let request = stored_request(record);
    let processor_charge_id = match (record.recovery_point, &record.processor_charge_id) {
        (RecoveryPoint::Charged | RecoveryPoint::Finished, Some(id)) => id.clone(),
        _ => match state.processor.cancel(&record.processor_key).await {
            Ok(CancelOutcome::Exists(charge)) => {
                if let Some(request) = &request
                    && !confirms(&charge, request.money)
                {
                    release(state, record).await?;
                    return Ok(());
                }
                charge.id
            }
            Ok(CancelOutcome::StillProcessing) => {
                tracing::info!(idempotency.key = %key, "completer: the processor is still processing; asking again later");
                release(state, record).await?;
                return Ok(());
            }
            Ok(CancelOutcome::Canceled) => {
                state
                    .store
                    .mark_failed(scope, key, fence)
                    .await
                    .map_err(|e| fail(&e))?;
                metrics::outcome("failed_by_completer");
                tracing::info!(idempotency.key = %key, "completer: no charge, and the processor key is canceled; record failed");
                return Ok(());
            }
            Err(error) => {
                release(state, record).await?;
                return Err(fail(&error));
            }
        },
    };
    let Some(request) = request else {
        // A charge is known but the request to record it with is not (a record claimed before
        // requests were stored): never failed, it waits for the client's retry, which carries
        // the request and resumes from the charge.
        tracing::error!(idempotency.key = %key, processor.charge_id = %processor_charge_id,
            "completer: a charge exists but the record holds no request to finish it with");
        release(state, record).await?;
        return Ok(());
    };
    let owner = Owner { scope, key, fence };
    let tenant = TenantId::new(scope.tenant.clone());
    let (completion, _) = finish_charge(state, owner, &tenant, &request, processor_charge_id)
        .await
        .map_err(|e| fail(&e))?;
    if completion != Completion::Fenced {
        metrics::outcome("completed_by_completer");
        tracing::info!(idempotency.key = %key, "completer: charge finished");
    }
    Ok(())
}

/// Leaves the record pending with its lock released: a client's retry may resume it at once,
/// and the completer looks again once the settle grace has passed.
async fn release(state: &AppState, record: &Abandoned) -> Result<(), String> {
    state
        .store
        .release_lock(&record.scope, &record.key, record.fence())
        .await
        .map(|_| ())
        .map_err(|e| error_chain(&e))
}

/// The validated request stored with the record, if it is there and still valid.
fn stored_request(record: &Abandoned) -> Option<ChargeRequest> {
    let body: CreateChargeBody = serde_json::from_slice(record.request_body.as_deref()?).ok()?;
    ChargeRequest::try_from(body).ok()
}
