//! The exactly-once protocol, written once for every operation:
//!
//! 0. a replay may be served from the Redis cache (fingerprint checked, 422 on mismatch);
//! 1. claim the key (insert, or judge the existing record; a lock only to take it over);
//! 2. prepare the effect for the record's generation (a refund reserves its amount on the
//!    charge), or store the final answer the state it meets calls for;
//! 3. perform the operation's effect at the processor with the record's processor key, the
//!    same on every attempt, and check that the effect is the one asked for;
//! 4. in one transaction, write what the operation created and the completed record with its
//!    response; cache the response; only then answer. A decline, a refusal and the
//!    completer's failure undo what the preparation holds in the transaction that ends the
//!    record ([`Operation::refuse`], [`Operation::fail`]).
//!
//! A first charge is two commits, the claim and the finish (its preparation writes nothing);
//! a first refund three, with the reservation between them. The `charged` recovery point is
//! written only when the finish fails, to leave the processor's id behind; an attempt that
//! dies before the finish is recovered through the processor key instead. Every write after
//! the claim is fenced by the record's generation and attempt number: if another attempt took
//! the record over meanwhile, this one writes nothing and answers from the record as it is.
//!
//! An operation ([`Operation`]) supplies only its request, its preparation, its effect and
//! settle at the processor, and the writes that end it. The completer ([`settle`]) runs the same steps
//! without a client. Nothing here knows HTTP: errors are [`ProtocolError`], mapped to
//! problem+json by the API in one place.

mod cache;
mod error;
mod operation;
pub(crate) mod settle;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use payments_domain::{CardProcessor, ProcessorError, TenantId};
use payments_idempotency::{
    Decision, Fingerprint, IdempotencyKey, RecentDurations, RecoveryPoint, Scope, StoredResponse,
    decide,
};
use payments_storage::{Claim, Claimed, Completion, Finish, ReplayCache, Store};

pub use error::ProtocolError;
pub use operation::{Operation, Owner, Prepared};

use crate::completions::Completions;
use crate::error_chain;
use crate::failpoint::{self, Failpoint};
use crate::metrics::{self, Outcome};

/// What the protocol works with: the records, the processor, the replay cache and the
/// in-process completion channel.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    pub store: &'a dyn Store,
    pub processor: &'a dyn CardProcessor,
    pub cache: Option<&'a ReplayCache>,
    pub completions: &'a Completions,
}

/// A validated request under its key, ready for the protocol.
#[derive(Debug)]
pub struct Attempt<R> {
    pub tenant: TenantId,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    /// The canonical JSON of the request, kept so the completer can finish it.
    pub canonical_body: Vec<u8>,
    pub request: R,
    /// `Prefer: wait=N`: how long a duplicate may wait for an in-flight attempt.
    pub wait: Option<Duration>,
}

/// What to send back: a response produced now or stored earlier, and when the key's
/// retention ends (counted from the record's completion).
#[derive(Debug)]
pub struct Answer {
    pub response: StoredResponse,
    pub replayed: bool,
    pub expires_at: DateTime<Utc>,
}

impl Answer {
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

/// An operation with what the protocol keeps for it: how long its recent attempts took, for
/// the `Retry-After` of a duplicate.
#[derive(Debug, Default)]
pub struct Idempotent<O> {
    operation: O,
    durations: RecentDurations,
}

impl<O> std::ops::Deref for Idempotent<O> {
    type Target = O;

    fn deref(&self) -> &O {
        &self.operation
    }
}

/// The scope of a key: the same key under another tenant or operation is another key.
pub fn scope_of<O: Operation>(tenant: &TenantId) -> Scope {
    Scope {
        tenant: tenant.as_str().to_owned(),
        operation: O::NAME.to_owned(),
    }
}

/// The fingerprint of a request to `O`: its route and its canonical JSON body.
pub fn fingerprint_of<O: Operation>(body: &serde_json::Value) -> Fingerprint {
    let (method, route) = O::ROUTE;
    Fingerprint::of_json_request(method, route, body)
}

/// Runs `attempt` of `op` through the protocol.
pub async fn run<O: Operation>(
    engine: Engine<'_>,
    op: &Idempotent<O>,
    attempt: Attempt<O::Request>,
) -> Result<Answer, ProtocolError> {
    let scope = scope_of::<O>(&attempt.tenant);
    if let Some(answer) = cache::replay(engine, &scope, &attempt).await {
        return answer;
    }
    let deadline = attempt.wait.map(|wait| tokio::time::Instant::now() + wait);
    loop {
        // Subscribe before claiming, so a completion between the two is not missed.
        let mut completions = engine.completions.subscribe();
        let claim = engine
            .store
            .claim(
                &scope,
                &attempt.key,
                &attempt.fingerprint,
                &attempt.canonical_body,
            )
            .await?;
        return match claim {
            Claim::Replay {
                response,
                generation,
                expires_at,
            } => {
                metrics::outcome(Outcome::ReplayedDb);
                cache::remember(engine, &scope, &attempt, generation, &response, expires_at).await;
                Ok(Answer::replayed(response, expires_at))
            }
            Claim::InFlight { retry_after_secs } => match deadline {
                Some(deadline) if tokio::time::Instant::now() < deadline => {
                    engine
                        .completions
                        .wait_for(&mut completions, &scope, &attempt.key, deadline)
                        .await;
                    continue;
                }
                _ => {
                    metrics::outcome(Outcome::InFlight);
                    Err(in_use(op, retry_after_secs))
                }
            },
            Claim::Mismatch => {
                metrics::outcome(Outcome::Mismatch);
                Err(ProtocolError::KeyReused)
            }
            Claim::Owned(claimed) => {
                if claimed.took_over {
                    metrics::outcome(Outcome::TakenOver);
                }
                if claimed.replaced {
                    cache::forget(engine, &scope, &attempt.key).await;
                }
                tracing::info!(
                    idempotency.operation = O::NAME,
                    idempotency.attempt = claimed.attempt.0,
                    idempotency.resume_from = %claimed.resume_from,
                    idempotency.took_over = claimed.took_over,
                    "executing"
                );
                let started = Instant::now();
                let answer = execute(engine, op, &scope, &attempt, claimed).await;
                if matches!(&answer, Ok(answer) if !answer.replayed) {
                    // What a duplicate arriving meanwhile is told to wait for (Retry-After).
                    op.durations.record(started.elapsed());
                }
                answer
            }
        };
    }
}

/// 409 for a duplicate of an attempt in flight. `Retry-After` says when the answer is likely
/// ready, from the durations of recent attempts, never later than the lock ends.
fn in_use<O: Operation>(op: &Idempotent<O>, lock_left_secs: u64) -> ProtocolError {
    ProtocolError::KeyInUse {
        retry_after_secs: op.durations.retry_after_secs(lock_left_secs),
    }
}

/// Steps 2 to 4 for the attempt that owns the record.
async fn execute<O: Operation>(
    engine: Engine<'_>,
    op: &Idempotent<O>,
    scope: &Scope,
    attempt: &Attempt<O::Request>,
    claimed: Claimed,
) -> Result<Answer, ProtocolError> {
    let owner = Owner {
        scope,
        key: &attempt.key,
        fence: claimed.fence(),
    };
    let plan = match op.prepare(engine.store, owner, &attempt.request).await? {
        Prepared::Ready(plan) => plan,
        Prepared::Refused(response) => {
            let completion = op.refuse(engine.store, owner, &response).await?;
            return answer_stored(engine, op, attempt, owner, completion, response).await;
        }
        Prepared::Fenced => return answer_from_record(engine, op, scope, attempt).await,
    };
    failpoint::hit(Failpoint::AfterClaim).await;
    let (effect_id, recorded) = match (claimed.resume_from, claimed.processor_charge_id) {
        // The processor already confirmed the effect: do not call it again.
        (RecoveryPoint::Charged | RecoveryPoint::Finished, Some(id)) => (id, true),
        _ => {
            let started = Instant::now();
            let effect = op
                .effect(engine.processor, &plan, &claimed.processor_key)
                .await;
            metrics::processor_call(O::PROCESSOR_CALL, started);
            match effect {
                Ok(effect) => {
                    failpoint::hit(Failpoint::AfterCharge).await;
                    if !confirms::<O>(&effect, &plan) {
                        // Never posted: the record stays pending and released, for the
                        // completer (and a person reading the metric) to look at again.
                        release(engine, owner).await?;
                        return Err(ProtocolError::ProcessorUnavailable);
                    }
                    // No `charged` write here: the finish records the effect, and an attempt
                    // that dies before it is recovered by the processor key (a retry's effect
                    // returns the same one; the completer's settle returns it too).
                    (O::effect_id(&effect), false)
                }
                Err(ProcessorError::Declined {
                    decline_code,
                    message,
                }) => {
                    // A decline is a final answer: stored and replayed like a success.
                    let response = op.declined(decline_code, message);
                    let completion = op.refuse(engine.store, owner, &response).await?;
                    return answer_stored(engine, op, attempt, owner, completion, response).await;
                }
                Err(ProcessorError::Unavailable { reason }) => {
                    // The outcome is unknown (a timeout may hide an effect): nothing final is
                    // stored and the lock is released. A retry resumes with the same processor
                    // key; if none comes, the completer settles the record with the processor
                    // once the settle grace has passed.
                    tracing::warn!(processor.error = %reason, "processor unavailable");
                    release(engine, owner).await?;
                    return Err(ProtocolError::ProcessorUnavailable);
                }
            }
        }
    };
    match op
        .finish(engine.store, owner, &plan, effect_id.clone())
        .await
    {
        Ok((completion, response)) => {
            if completion != Completion::Fenced {
                failpoint::hit(Failpoint::AfterCommit).await;
            }
            answer_stored(engine, op, attempt, owner, completion, response).await
        }
        Err(error) => {
            if !recorded {
                leave_effect_behind(engine, owner, &effect_id).await;
            }
            Err(error)
        }
    }
}

/// The answer after a completing write: the stored response, or, if the write was fenced off,
/// whatever the record says now.
async fn answer_stored<O: Operation>(
    engine: Engine<'_>,
    op: &Idempotent<O>,
    attempt: &Attempt<O::Request>,
    owner: Owner<'_>,
    completion: Completion,
    response: StoredResponse,
) -> Result<Answer, ProtocolError> {
    let Completion::Stored { expires_at } = completion else {
        return answer_from_record(engine, op, owner.scope, attempt).await;
    };
    engine.completions.announce(owner.scope, owner.key);
    metrics::outcome(Outcome::Executed);
    let generation = owner.fence.resource_id;
    cache::remember(
        engine,
        owner.scope,
        attempt,
        generation,
        &response,
        expires_at,
    )
    .await;
    Ok(Answer::fresh(response, expires_at))
}

/// Whether the processor's effect is the one the request asked for. A mismatch is logged and
/// counted, and never reaches the ledger.
pub(crate) fn confirms<O: Operation>(effect: &O::Effect, plan: &O::Plan) -> bool {
    let Err(mismatch) = O::confirms(effect, plan) else {
        return true;
    };
    metrics::processor_mismatch();
    tracing::error!(
        processor.effect_id = %O::effect_id(effect),
        error = %mismatch,
        "the processor reported an effect that is not the one requested; it is not recorded"
    );
    false
}

/// Leaves the record pending with its lock released: a retry may resume it at once, and the
/// completer settles it once the settle grace has passed.
pub(crate) async fn release(engine: Engine<'_>, owner: Owner<'_>) -> Result<(), ProtocolError> {
    engine
        .store
        .release_lock(owner.scope, owner.key, owner.fence)
        .await?;
    Ok(())
}

/// The finish failed after the processor made the effect: record the `charged` recovery
/// point, so that whoever resumes the record finishes it without asking the processor again.
/// Best effort: if this write fails too, the processor key still finds the effect.
async fn leave_effect_behind(engine: Engine<'_>, owner: Owner<'_>, effect_id: &str) {
    match engine
        .store
        .record_charged(owner.scope, owner.key, owner.fence, effect_id)
        .await
    {
        Ok(Finish::Written) => failpoint::hit(Failpoint::AfterRecordCharged).await,
        Ok(Finish::Fenced) => {}
        Err(error) => tracing::warn!(
            error = %error_chain(&error),
            "could not record the charged recovery point; the processor key still finds the effect"
        ),
    }
}

/// This attempt lost its record to another one: answer with whatever the record says now.
async fn answer_from_record<O: Operation>(
    engine: Engine<'_>,
    op: &Idempotent<O>,
    scope: &Scope,
    attempt: &Attempt<O::Request>,
) -> Result<Answer, ProtocolError> {
    metrics::outcome(Outcome::Fenced);
    tracing::warn!("attempt was fenced off; answering from the record");
    let Some((record, now)) = engine.store.find_record(scope, &attempt.key).await? else {
        return Err(in_use(op, 1));
    };
    match decide(Some(&record), &attempt.fingerprint, now) {
        Decision::Replay(response) => Ok(Answer::replayed(response, record.expires_at)),
        Decision::InFlight { retry_after_secs } => Err(in_use(op, retry_after_secs)),
        Decision::Mismatch => Err(ProtocolError::KeyReused),
        Decision::Execute
        | Decision::Resume { .. }
        | Decision::RetryFailed
        | Decision::ReplaceExpired => Err(in_use(op, 1)),
    }
}
