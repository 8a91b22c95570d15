//! The completer's half of the protocol: settling a record whose attempt ended without an
//! answer, on behalf of a client that may never retry, for any operation.
//!
//! The record was taken over only once its lock ended at least the settle grace ago, so any
//! effect call made under that lock has finished at the effect port. The effect port is then
//! asked for a definitive answer under the record's effect key ([`Operation::settle`]), which
//! never creates anything:
//! - the effect exists: prepared again from the stored request (which finds what the attempt
//!   that made it prepared), checked against that, then finished exactly as the request would
//!   have finished it;
//! - a call is still processing, or the effect port cannot be reached: the record stays
//!   pending, released, and a later round asks again;
//! - none, and the key is now tombstoned: only then is the record failed (with what its
//!   preparation held, [`Operation::end_unmade`]), and the client's retry starts a new generation
//!   with a new effect key.
//!
//! "I could not find an effect" is never read as "there is no effect".

use super::ports::{Abandoned, Outcome};
use super::transaction::Ended;
use super::{Engine, Idempotent, Operation, Prepared, ProtocolError, Settled, Unmade};
use crate::{AS_SENT, RecoveryPoint};

/// How a settle ended, for its caller to count or act on; the record says the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOutcome {
    /// The effect exists and is recorded: the record is completed (or was, by another).
    Finished,
    /// Still processing, no answer, or nothing to finish it with: released, asked again later.
    Released,
    /// The effect port reported an effect that is not the one requested: never recorded; the
    /// record is released and stays pending until a person resolves it.
    Mismatched,
    /// Nothing was made and the effect key is tombstoned: the record is failed.
    Failed,
}

/// What the completer knows of the effect of a record it took over.
enum Found<E> {
    /// The `charged` recovery point: the effect port confirmed it, and this is its id.
    Recorded(String),
    /// The effect port reported it just now, still to be checked against the request.
    Reported(E),
}

impl<T: Send + 'static> Engine<T> {
    /// Settles `record` of operation `op`.
    pub async fn settle<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        record: &Abandoned,
    ) -> Result<SettleOutcome, ProtocolError> {
        let owner = record.owner();
        let key = &record.key;
        let found = match (record.recovery_point, &record.effect_id) {
            (RecoveryPoint::EffectMade | RecoveryPoint::Finished, Some(id)) => {
                Found::Recorded(id.clone())
            }
            _ => match op.settle(&record.effect_key).await {
                Ok(Settled::Exists(effect)) => Found::Reported(effect),
                Ok(Settled::StillProcessing) => {
                    tracing::info!(idempotency.key = %key, "completer: the effect port is still processing; asking again later");
                    return self.release(owner).await.map(|()| SettleOutcome::Released);
                }
                Ok(Settled::Tombstoned) => {
                    self.end_unmade(&op.operation, owner, Unmade::Tombstoned)
                        .await?;
                    self.observer.outcome(Outcome::FailedByCompleter);
                    tracing::info!(idempotency.key = %key, "completer: nothing was made, and the effect key is tombstoned; record failed");
                    return Ok(SettleOutcome::Failed);
                }
                Err(error) => {
                    tracing::warn!(idempotency.key = %key, error = %error, "completer: the effect port did not answer; asking again later");
                    return self.release(owner).await.map(|()| SettleOutcome::Released);
                }
            },
        };
        if ![AS_SENT, O::REQUEST_VERSION].contains(&record.request_version) {
            // A request of another request version means something this version does not
            // know: never finished from it here. A completer of that version, or the client's
            // retry to one, settles it.
            tracing::error!(idempotency.key = %key, request_version = record.request_version,
                "completer: the record's request is of another request version; left pending");
            return self.release(owner).await.map(|()| SettleOutcome::Released);
        }
        let request = record
            .request_body
            .as_deref()
            .and_then(|body| op.stored_request(body));
        let Some(request) = request else {
            // An effect is known but the request to record it with is not (a record claimed
            // before requests were stored): never failed, it waits for the client's retry,
            // which carries the request and resumes from the effect.
            tracing::error!(idempotency.key = %key,
                "completer: an effect exists but the record holds no request to finish it with");
            return self.release(owner).await.map(|()| SettleOutcome::Released);
        };
        // What the effect was prepared with: the attempt that made it prepared it first, so
        // this finds what that attempt prepared.
        let Prepared::Ready(plan) = self.prepare(&op.operation, owner, &request).await? else {
            tracing::error!(idempotency.key = %key,
                "completer: an effect exists but what it was prepared with is not found; left pending");
            return self.release(owner).await.map(|()| SettleOutcome::Released);
        };
        let effect_id = match found {
            Found::Recorded(id) => id,
            Found::Reported(effect) => {
                if !self.confirms::<O>(&effect, &plan) {
                    return self
                        .release(owner)
                        .await
                        .map(|()| SettleOutcome::Mismatched);
                }
                O::effect_id(&effect)
            }
        };
        let finished = self
            .finish(&op.operation, owner, &plan, effect_id.clone())
            .await;
        let ended = self
            .unless_refused(&op.operation, owner, &effect_id, finished)
            .await?;
        if let Ended::Stored { .. } = ended {
            self.completions.announce(owner.scope, key);
            self.observer.outcome(Outcome::CompletedByCompleter);
            tracing::info!(idempotency.key = %key, "completer: record finished");
        }
        Ok(SettleOutcome::Finished)
    }
}
