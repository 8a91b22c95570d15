//! Background workers every instance runs: the completer and the reaper. Both are safe to run
//! on any number of instances at once (`FOR UPDATE SKIP LOCKED`, fenced writes).

use std::time::Duration;

use payments_domain::{ChargeRequest, TenantId};
use payments_idempotency::RecoveryPoint;
use payments_storage::{Abandoned, Finish};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::charge_flow::{Owner, finish_charge};
use crate::views::CreateChargeBody;
use crate::{AppState, error_chain};

/// How often each worker runs, and how much it takes per round.
#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    pub completer_interval: Duration,
    pub completer_batch: i64,
    pub reaper_interval: Duration,
    pub reaper_batch: i64,
}

/// Starts the workers; they stop when `shutdown` turns true.
pub fn spawn(
    state: AppState,
    settings: WorkerSettings,
    shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let completer_state = state.clone();
    vec![
        tokio::spawn(every(
            settings.completer_interval,
            shutdown.clone(),
            move || {
                let state = completer_state.clone();
                async move { complete_abandoned(&state, settings.completer_batch).await }
            },
        )),
        tokio::spawn(every(settings.reaper_interval, shutdown, move || {
            let state = state.clone();
            async move { reap(&state, settings.reaper_batch).await }
        })),
    ]
}

/// Runs `round` every `interval` until shutdown. A round in progress is finished first.
async fn every<F, Fut>(interval: Duration, mut shutdown: watch::Receiver<bool>, round: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => round().await,
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Drives abandoned pending records to an end without their client. It asks the processor
/// whether a charge exists under the record's processor key and never creates one: found, it
/// finishes the charge; not found, it marks the record failed so the next retry executes.
async fn complete_abandoned(state: &AppState, batch: i64) {
    let abandoned = match state.store.take_over_abandoned(batch).await {
        Ok(abandoned) => abandoned,
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "completer: cannot read abandoned records");
            return;
        }
    };
    for record in abandoned {
        if let Err(error) = complete_one(state, &record).await {
            // The record keeps its new lock; when that expires, the next round tries again.
            tracing::warn!(idempotency.key = %record.key, error = %error, "completer: record left pending");
        }
    }
}

async fn complete_one(state: &AppState, record: &Abandoned) -> Result<(), String> {
    let fail = |e: &dyn std::error::Error| error_chain(e);
    let owner = Owner {
        scope: &record.scope,
        key: &record.key,
        attempt: record.attempt,
        resource_id: record.resource_id,
    };
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
                tracing::info!(idempotency.key = %record.key, idempotency.outcome = "failed_by_completer", "completer: no charge at the processor");
                return Ok(());
            }
        },
    };
    let tenant = TenantId::new(record.scope.tenant.clone());
    let (finish, _) = finish_charge(state, owner, &tenant, &request, processor_charge_id)
        .await
        .map_err(|e| fail(&e))?;
    if finish == Finish::Written {
        tracing::info!(idempotency.key = %record.key, idempotency.outcome = "completed_by_completer", "completer: charge finished");
    }
    Ok(())
}

/// The validated request stored with the record, if it is there and still valid.
fn stored_request(record: &Abandoned) -> Option<ChargeRequest> {
    let body: CreateChargeBody = serde_json::from_slice(record.request_body.as_deref()?).ok()?;
    ChargeRequest::try_from(body).ok()
}

/// Deletes expired finished records in batches until none is left.
async fn reap(state: &AppState, batch: i64) {
    let mut total = 0;
    loop {
        match state.store.reap_expired(batch).await {
            Ok(deleted) => {
                total += deleted;
                if deleted < batch.unsigned_abs() {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "reaper: delete failed");
                break;
            }
        }
    }
    if total > 0 {
        tracing::info!(reaper.deleted = total, "reaper: expired records deleted");
    }
}
