//! `POST /charges` from claim to response: the exactly-once flow of DESIGN.md section 4.
//!
//! 0. a replay may be served from the Redis cache (fingerprint checked, 422 on mismatch);
//! 1. claim the key (insert, or judge the existing record under a row lock);
//! 2. charge the card with the record's processor key, the same on every attempt, and check
//!    that the processor's charge is the one asked for;
//! 3. in one statement (one transaction), write the charge, its ledger transaction, its outbox
//!    event and the completed record with the response; cache the response; only then answer.
//!
//! A first charge is two commits: the claim and the finish. The `charged` recovery point is
//! written only when the finish fails, to leave the processor's charge id behind; an attempt
//! that dies before the finish is recovered through the processor key instead.
//!
//! Every write after the claim is fenced by the record's generation and attempt number: if
//! another attempt took the record over meanwhile, this one writes nothing and answers from
//! the record as it now is.

use std::time::{Duration, Instant};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use payments_domain::{
    Charge, ChargeId, ChargeRequest, Money, ProcessorCharge, ProcessorChargeRequest,
    ProcessorError, TenantId,
};
use payments_idempotency::{
    CHARGES_CREATE_V1, Decision, Fingerprint, IdempotencyKey, RecoveryPoint, Scope, StoredResponse,
    decide,
};
use payments_storage::{Claim, Claimed, Completion, Fence, Finish, StoreError};

use crate::failpoint::{self, Failpoint, Failure};
use crate::views::ChargeView;
use crate::{ApiError, AppState, error_chain, metrics};

/// A validated charge request with its key and fingerprint.
#[derive(Debug)]
pub struct NewCharge {
    pub tenant: TenantId,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    /// The canonical JSON of the request, kept so the completer can finish it.
    pub canonical_body: Vec<u8>,
    pub request: ChargeRequest,
    /// `Prefer: wait=N`: how long a duplicate may wait for an in-flight attempt.
    pub wait: Option<Duration>,
}

/// What to send back: a response produced now or stored earlier, and when the key's
/// retention ends (counted from the record's completion).
#[derive(Debug)]
pub struct ChargeOutcome {
    pub response: StoredResponse,
    pub replayed: bool,
    pub expires_at: DateTime<Utc>,
}

impl ChargeOutcome {
    fn fresh(response: StoredResponse, expires_at: DateTime<Utc>) -> Self {
        Self {
            response,
            replayed: false,
            expires_at,
        }
    }

    fn replayed(response: StoredResponse, expires_at: DateTime<Utc>) -> Self {
        Self {
            response,
            replayed: true,
            expires_at,
        }
    }
}

/// The record an attempt owns, and the fence it writes under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    pub scope: &'a Scope,
    pub key: &'a IdempotencyKey,
    pub fence: Fence,
}

/// Runs the flow for one request.
pub async fn create_charge(state: &AppState, new: NewCharge) -> Result<ChargeOutcome, ApiError> {
    let scope = Scope {
        tenant: new.tenant.as_str().to_owned(),
        operation: CHARGES_CREATE_V1.to_owned(),
    };
    if let Some(answer) = replay_from_cache(state, &scope, &new).await {
        return answer;
    }
    let deadline = new.wait.map(|wait| tokio::time::Instant::now() + wait);
    loop {
        // Subscribe before claiming, so a completion between the two is not missed.
        let mut completions = state.completions.subscribe();
        let claim = state
            .store
            .claim(&scope, &new.key, &new.fingerprint, &new.canonical_body)
            .await?;
        return match claim {
            Claim::Replay {
                response,
                expires_at,
            } => {
                metrics::outcome("replayed_db");
                remember(state, &scope, &new, &response, expires_at).await;
                Ok(ChargeOutcome::replayed(response, expires_at))
            }
            Claim::InFlight { retry_after_secs } => match deadline {
                Some(deadline) if tokio::time::Instant::now() < deadline => {
                    state
                        .completions
                        .wait_for(&mut completions, &scope, &new.key, deadline)
                        .await;
                    continue;
                }
                _ => {
                    metrics::outcome("in_flight");
                    Err(in_use(state, retry_after_secs))
                }
            },
            Claim::Mismatch => {
                metrics::outcome("mismatch");
                Err(ApiError::IdempotencyKeyReused)
            }
            Claim::Owned(claimed) => {
                if claimed.took_over {
                    metrics::outcome("taken_over");
                }
                if claimed.replaced {
                    forget(state, &scope, &new.key).await;
                }
                tracing::info!(
                    idempotency.attempt = claimed.attempt.0,
                    idempotency.resume_from = %claimed.resume_from,
                    idempotency.took_over = claimed.took_over,
                    "executing charge"
                );
                failpoint::hit(Failpoint::AfterClaim).await;
                let started = Instant::now();
                let outcome = execute(state, &scope, &new, claimed).await;
                if matches!(&outcome, Ok(answer) if !answer.replayed) {
                    // What a duplicate arriving meanwhile is told to wait for (Retry-After).
                    state.charge_durations.record(started.elapsed());
                }
                outcome
            }
        };
    }
}

/// 409 for a duplicate of an attempt in flight. `Retry-After` says when the answer is likely
/// ready, from the durations of recent attempts, never later than the lock ends.
fn in_use(state: &AppState, lock_left_secs: u64) -> ApiError {
    ApiError::IdempotencyKeyInUse {
        retry_after_secs: state.charge_durations.retry_after_secs(lock_left_secs),
    }
}

/// Serves a replay from Redis when it has one. A miss, or any Redis failure, falls through
/// to the database: Redis can make a replay faster, never make a request fail.
async fn replay_from_cache(
    state: &AppState,
    scope: &Scope,
    new: &NewCharge,
) -> Option<Result<ChargeOutcome, ApiError>> {
    let cache = state.cache.as_ref()?;
    match cache.get(scope, &new.key).await {
        // An entry outliving its record (Redis's clock behind) is a miss: the claim judges the
        // key by the database's clock, and replacing the record deletes the entry.
        Ok(Some(hit)) if hit.expires_at <= Utc::now() => None,
        Ok(Some(hit)) if hit.fingerprint == new.fingerprint => {
            metrics::outcome("replayed_cache");
            Some(Ok(ChargeOutcome::replayed(hit.response, hit.expires_at)))
        }
        Ok(Some(_)) => {
            metrics::outcome("mismatch");
            Some(Err(ApiError::IdempotencyKeyReused))
        }
        Ok(None) => None,
        Err(error) => {
            metrics::redis_error("cache_get");
            tracing::warn!(error = %error_chain(&error), "replay cache read failed; using the database");
            None
        }
    }
}

/// Puts a final response in the replay cache until the record's own expiry, an absolute
/// time from the database's clock; Redis expires the entry at that instant by its own clock,
/// which NTP keeps far closer to the database's than the retention is long.
async fn remember(
    state: &AppState,
    scope: &Scope,
    new: &NewCharge,
    response: &StoredResponse,
    expires_at: DateTime<Utc>,
) {
    let Some(cache) = &state.cache else { return };
    if let Err(error) = cache
        .put(scope, &new.key, &new.fingerprint, response, expires_at)
        .await
    {
        metrics::redis_error("cache_put");
        tracing::warn!(error = %error_chain(&error), "replay cache write failed");
    }
}

/// Drops the cached response of a generation the claim just replaced. The entry expires with
/// its record anyway; this covers clocks that disagree.
async fn forget(state: &AppState, scope: &Scope, key: &IdempotencyKey) {
    let Some(cache) = &state.cache else { return };
    if let Err(error) = cache.forget(scope, key).await {
        metrics::redis_error("cache_forget");
        tracing::warn!(error = %error_chain(&error), "replay cache delete failed");
    }
}

async fn execute(
    state: &AppState,
    scope: &Scope,
    new: &NewCharge,
    claimed: Claimed,
) -> Result<ChargeOutcome, ApiError> {
    let store = &state.store;
    let fence = claimed.fence();
    let owner = Owner {
        scope,
        key: &new.key,
        fence,
    };
    let (processor_charge_id, recorded) = match (claimed.resume_from, claimed.processor_charge_id) {
        // The processor already confirmed the charge: do not call it again.
        (RecoveryPoint::Charged | RecoveryPoint::Finished, Some(id)) => (id, true),
        _ => {
            let request = ProcessorChargeRequest {
                idempotency_key: claimed.processor_key.clone(),
                money: new.request.money,
                source: new.request.source.clone(),
            };
            let started = Instant::now();
            let charged = state.processor.charge(request).await;
            metrics::processor_call("charge", started);
            match charged {
                Ok(charge) => {
                    failpoint::hit(Failpoint::AfterCharge).await;
                    if !confirms(&charge, new.request.money) {
                        // Never posted: the record stays pending and released, for the
                        // completer (and a person reading the metric) to look at again.
                        store.release_lock(scope, &new.key, fence).await?;
                        return Err(ApiError::ProcessorUnavailable);
                    }
                    // No `charged` write here: the finish records the charge, and an attempt
                    // that dies before it is recovered by the processor key (a retry's charge
                    // returns the same charge; the completer's cancel returns it too).
                    (charge.id, false)
                }
                Err(ProcessorError::Declined {
                    decline_code,
                    message,
                }) => {
                    // A decline is a final answer: stored and replayed like a success.
                    let response = ApiError::CardDeclined {
                        decline_code,
                        message,
                    }
                    .to_stored_response();
                    let completion = store
                        .finish_without_charge(scope, &new.key, fence, &response)
                        .await?;
                    let Completion::Stored { expires_at } = completion else {
                        return answer_from_record(state, scope, new).await;
                    };
                    state.completions.announce(scope, &new.key);
                    metrics::outcome("executed");
                    remember(state, scope, new, &response, expires_at).await;
                    return Ok(ChargeOutcome::fresh(response, expires_at));
                }
                Err(ProcessorError::Unavailable { reason }) => {
                    // The outcome is unknown (a timeout may hide a charge): nothing final is
                    // stored and the lock is released. A retry resumes with the same processor
                    // key; if none comes, the completer settles the record with the processor
                    // once the settle grace has passed.
                    tracing::warn!(processor.error = %reason, "card processor unavailable");
                    store.release_lock(scope, &new.key, fence).await?;
                    return Err(ApiError::ProcessorUnavailable);
                }
            }
        }
    };
    let finished = finish_charge(
        state,
        owner,
        &new.tenant,
        &new.request,
        processor_charge_id.clone(),
    )
    .await;
    match finished {
        Ok((Completion::Stored { expires_at }, response)) => {
            failpoint::hit(Failpoint::AfterCommit).await;
            metrics::outcome("executed");
            remember(state, scope, new, &response, expires_at).await;
            Ok(ChargeOutcome::fresh(response, expires_at))
        }
        Ok((Completion::Fenced, _)) => answer_from_record(state, scope, new).await,
        Err(error) => {
            if !recorded {
                leave_charge_behind(state, owner, &processor_charge_id).await;
            }
            Err(error)
        }
    }
}

/// The finish failed after the processor charged: record the `charged` recovery point, so
/// that whoever resumes the record finishes it without asking the processor again. Best
/// effort: if this write fails too, the processor key still finds the charge.
async fn leave_charge_behind(state: &AppState, owner: Owner<'_>, processor_charge_id: &str) {
    match state
        .store
        .record_charged(owner.scope, owner.key, owner.fence, processor_charge_id)
        .await
    {
        Ok(Finish::Written) => failpoint::hit(Failpoint::AfterRecordCharged).await,
        Ok(Finish::Fenced) => {}
        Err(error) => tracing::warn!(
            error = %error_chain(&error),
            "could not record the charged recovery point; the processor key still finds the charge"
        ),
    }
}

/// Whether the processor's charge is the one the request asked for: succeeded, for exactly
/// its amount and currency. A mismatch is logged and counted, and never reaches the ledger.
pub(crate) fn confirms(charge: &ProcessorCharge, requested: Money) -> bool {
    let Err(mismatch) = charge.confirms(requested) else {
        return true;
    };
    metrics::processor_mismatch();
    tracing::error!(
        processor.charge_id = %charge.id,
        error = %mismatch,
        "the processor reported a charge that is not the one requested; it is not recorded"
    );
    false
}

/// Step 3, shared by requests and the completer: the charge, its ledger transaction, its
/// event and the completed record in one statement, fenced by the owner's generation and
/// attempt.
pub(crate) async fn finish_charge(
    state: &AppState,
    owner: Owner<'_>,
    tenant: &TenantId,
    request: &ChargeRequest,
    processor_charge_id: String,
) -> Result<(Completion, StoredResponse), ApiError> {
    let charge = Charge {
        id: ChargeId::from_uuid(owner.fence.resource_id),
        tenant: tenant.clone(),
        money: request.money,
        source: request.source.clone(),
        description: request.description.clone(),
        processor_charge_id,
        created_at: now_to_the_microsecond(),
    };
    let response = created_response(&charge)?;
    if failpoint::fails(Failure::Finish) {
        return Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut).into());
    }
    let completion = state
        .store
        .finish_charge(owner.scope, owner.key, owner.fence, &charge, &response)
        .await?;
    if completion != Completion::Fenced {
        tracing::info!(charge.id = %charge.id, "charge created");
        state.completions.announce(owner.scope, owner.key);
    }
    Ok((completion, response))
}

/// This attempt lost its record to another one: answer with whatever the record says now.
async fn answer_from_record(
    state: &AppState,
    scope: &Scope,
    new: &NewCharge,
) -> Result<ChargeOutcome, ApiError> {
    metrics::outcome("fenced");
    tracing::warn!("attempt was fenced off; answering from the record");
    let Some((record, now)) = state.store.find_record(scope, &new.key).await? else {
        return Err(in_use(state, 1));
    };
    match decide(Some(&record), &new.fingerprint, now) {
        Decision::Replay(response) => Ok(ChargeOutcome::replayed(response, record.expires_at)),
        Decision::InFlight { retry_after_secs } => Err(in_use(state, retry_after_secs)),
        Decision::Mismatch => Err(ApiError::IdempotencyKeyReused),
        Decision::Execute
        | Decision::Resume { .. }
        | Decision::RetryFailed
        | Decision::ReplaceExpired => Err(in_use(state, 1)),
    }
}

/// The 201 response, serialised once: the bytes sent now are the bytes stored for replays.
/// The bench floor `POST /bench/charge-2` stores the same.
pub(crate) fn created_response(charge: &Charge) -> Result<StoredResponse, ApiError> {
    let body =
        serde_json::to_vec(&ChargeView::from(charge)).map_err(|e| ApiError::Internal(e.into()))?;
    let location = format!("/charges/{}", charge.id);
    Ok(StoredResponse::new(
        201,
        [
            ("content-type", "application/json"),
            ("location", location.as_str()),
        ],
        body,
    ))
}

/// PostgreSQL keeps microseconds: truncating first makes a charge read back identical.
fn now_to_the_microsecond() -> DateTime<Utc> {
    let now = Utc::now();
    now.duration_trunc(TimeDelta::microseconds(1))
        .unwrap_or(now)
}
