//! What an operation plugs into the protocol: its request, its effect at the processor, and
//! the writes of its finish. Everything else (the claim, the recovery points, the fence, the
//! cache, the completer's settle) is the protocol's, the same for every operation.

use async_trait::async_trait;
use payments_domain::{CancelOutcome, CardProcessor, ProcessorError, TenantId};
use payments_idempotency::{IdempotencyKey, Scope, StoredResponse};
use payments_storage::{Completion, Fence, Finish, Store};

use super::ProtocolError;
use crate::metrics::ProcessorCall;

/// The record an attempt owns, and the fence it writes under.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub scope: &'a Scope,
    pub key: &'a IdempotencyKey,
    pub fence: Fence,
}

impl Owner<'_> {
    /// The tenant the record belongs to.
    pub fn tenant(&self) -> TenantId {
        TenantId::new(self.scope.tenant.clone())
    }
}

/// What [`Operation::prepare`] decided.
#[derive(Debug)]
pub enum Prepared<P> {
    /// Go on to the effect with this plan.
    Ready(P),
    /// A final answer, decided by the state the request meets rather than by the processor
    /// (a refund larger than what is left): stored and replayed like a decline.
    Refused(StoredResponse),
    /// Another attempt owns the record now: answer from the record.
    Fenced,
}

/// One idempotent operation, such as creating a charge.
///
/// After the claim, the protocol asks the operation to [`prepare`](Self::prepare) the effect
/// (a refund reserves its amount on the charge there), then calls [`effect`](Self::effect) at
/// most once per attempt, always with the record's processor key, so that the processor
/// deduplicates every attempt of one request; [`settle`](Self::settle) is the completer's
/// definitive question under the same key, and must never create anything.
#[async_trait]
pub trait Operation: Send + Sync + 'static {
    /// The validated request.
    type Request: Send + Sync;
    /// What the effect is made of, once prepared: the request itself, or what the request
    /// came to against the state it met (a refund's reserved amount).
    type Plan: Send + Sync;
    /// What the processor reports the effect to be.
    type Effect: Send + Sync;

    /// The scope's operation, with its schema version (`charges.create.v1`).
    const NAME: &'static str;

    /// The processor call of [`effect`](Self::effect), as the metrics name it.
    const PROCESSOR_CALL: ProcessorCall;

    /// The method and route template the request's fingerprint covers (`POST`, `/charges`):
    /// the same body sent to another endpoint under the same key is another request.
    const ROUTE: (&'static str, &'static str);

    /// Rebuilds the request from the canonical body stored with the record, for the completer.
    /// `None` if the record holds none or it is no longer valid.
    fn stored_request(&self, body: &[u8]) -> Option<Self::Request>;

    /// Prepares the effect of `request` for the generation `owner` holds, fenced by it. Called
    /// by every attempt and by the completer before it finishes, so it must be idempotent per
    /// generation: a second call returns what the first one prepared.
    async fn prepare(
        &self,
        store: &dyn Store,
        owner: Owner<'_>,
        request: &Self::Request,
    ) -> Result<Prepared<Self::Plan>, ProtocolError>;

    /// Performs the effect at the processor under `processor_key`, or returns the one already
    /// performed under it.
    async fn effect(
        &self,
        processor: &dyn CardProcessor,
        plan: &Self::Plan,
        processor_key: &str,
    ) -> Result<Self::Effect, ProcessorError>;

    /// Settles `processor_key` for good: the effect made under it, "still processing", or a
    /// tombstone that makes any later effect under it impossible.
    async fn settle(
        &self,
        processor: &dyn CardProcessor,
        processor_key: &str,
    ) -> Result<CancelOutcome<Self::Effect>, ProcessorError>;

    /// The processor's id of the effect, kept by the `charged` recovery point.
    fn effect_id(effect: &Self::Effect) -> String;

    /// Whether the processor's effect is the one `plan` asked for; a mismatch is never
    /// posted. The reason goes to the log.
    fn confirms(effect: &Self::Effect, plan: &Self::Plan) -> Result<(), String>;

    /// The stored answer to a definitive refusal by the processor (a decline).
    fn declined(&self, decline_code: String, message: String) -> StoredResponse;

    /// Writes what the operation created, with the completed record and its `response`, in
    /// one transaction fenced by `owner`; returns the response it stored.
    async fn finish(
        &self,
        store: &dyn Store,
        owner: Owner<'_>,
        plan: &Self::Plan,
        effect_id: String,
    ) -> Result<(Completion, StoredResponse), ProtocolError>;

    /// Completes the record with a final answer that created nothing (a decline, a refusal),
    /// undoing whatever [`prepare`](Self::prepare) held, in one transaction fenced by `owner`.
    async fn refuse(
        &self,
        store: &dyn Store,
        owner: Owner<'_>,
        response: &StoredResponse,
    ) -> Result<Completion, ProtocolError> {
        Ok(store
            .finish_without_charge(owner.scope, owner.key, owner.fence, response)
            .await?)
    }

    /// Fails the record once the processor has tombstoned its key (nothing was made, and
    /// nothing can be), undoing whatever [`prepare`](Self::prepare) held, in one transaction.
    async fn fail(&self, store: &dyn Store, owner: Owner<'_>) -> Result<Finish, ProtocolError> {
        Ok(store
            .mark_failed(owner.scope, owner.key, owner.fence)
            .await?)
    }
}
