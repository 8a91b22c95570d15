//! The completer's half of the protocol: settling a record whose attempt ended without an
//! answer, on behalf of a client that may never retry, for any operation.
//!
//! The record was taken over only once its lock ended at least the settle grace ago, so any
//! processor call made under that lock has finished at the processor. The processor is then
//! asked for a definitive answer under the record's processor key
//! ([`Operation::settle`]), which never creates anything:
//! - the effect exists: checked against the stored request, then finished exactly as the
//!   request would have finished it;
//! - a call is still processing, or the processor cannot be reached: the record stays
//!   pending, released, and a later round asks again;
//! - none, and the key is now tombstoned: only then is the record failed, and the client's
//!   retry starts a new generation with a new processor key.
//!
//! "I could not find an effect" is never read as "there is no effect".

use payments_domain::CancelOutcome;
use payments_idempotency::RecoveryPoint;
use payments_storage::{Abandoned, Completion};

use super::{Engine, Operation, Owner, ProtocolError, confirms, release};
use crate::metrics::{self, Outcome};

/// Settles `record` of operation `op`.
pub async fn settle<O: Operation>(
    engine: Engine<'_>,
    op: &O,
    record: &Abandoned,
) -> Result<(), ProtocolError> {
    let owner = Owner {
        scope: &record.scope,
        key: &record.key,
        fence: record.fence(),
    };
    let key = &record.key;
    let request = record
        .request_body
        .as_deref()
        .and_then(|body| op.stored_request(body));
    let effect_id = match (record.recovery_point, &record.processor_charge_id) {
        (RecoveryPoint::Charged | RecoveryPoint::Finished, Some(id)) => id.clone(),
        _ => match op.settle(engine.processor, &record.processor_key).await {
            Ok(CancelOutcome::Exists(effect)) => {
                if let Some(request) = &request
                    && !confirms::<O>(&effect, request)
                {
                    return release(engine, owner).await;
                }
                O::effect_id(&effect)
            }
            Ok(CancelOutcome::StillProcessing) => {
                tracing::info!(idempotency.key = %key, "completer: the processor is still processing; asking again later");
                return release(engine, owner).await;
            }
            Ok(CancelOutcome::Canceled) => {
                engine
                    .store
                    .mark_failed(owner.scope, key, owner.fence)
                    .await?;
                metrics::outcome(Outcome::FailedByCompleter);
                tracing::info!(idempotency.key = %key, "completer: nothing was made, and the processor key is canceled; record failed");
                return Ok(());
            }
            Err(error) => {
                tracing::warn!(idempotency.key = %key, error = %error, "completer: the processor did not answer; asking again later");
                return release(engine, owner).await;
            }
        },
    };
    let Some(request) = request else {
        // An effect is known but the request to record it with is not (a record claimed before
        // requests were stored): never failed, it waits for the client's retry, which carries
        // the request and resumes from the effect.
        tracing::error!(idempotency.key = %key, processor.effect_id = %effect_id,
            "completer: an effect exists but the record holds no request to finish it with");
        return release(engine, owner).await;
    };
    let (completion, _) = op.finish(engine.store, owner, &request, effect_id).await?;
    if let Completion::Stored { .. } = completion {
        engine.completions.announce(owner.scope, key);
        metrics::outcome(Outcome::CompletedByCompleter);
        tracing::info!(idempotency.key = %key, "completer: record finished");
    }
    Ok(())
}
