//! What an operation plugs into the engine: its request, its effect through a port of its own,
//! and its own rows, written in the transactions the engine begins over its record. Everything
//! else (the claim, the recovery points, the fence, the record's transaction and its end, the
//! cache, the completer's settle) is the engine's, the same for every operation.

use std::fmt;

use async_trait::async_trait;
use uuid::Uuid;

use super::ports::{Begin, Owner, RecordStore, Unmade};
use super::transaction::Sharing;
use super::{ProtocolError, StoreFailure};
use crate::{SchemaVersion, StoredResponse};

/// What [`Operation::prepare`] decided.
#[derive(Debug)]
pub enum Prepared<P> {
    /// Go on to the effect with this plan.
    Ready(P),
    /// A final answer, decided by the state the request meets rather than by the effect port
    /// (a refund larger than what is left): stored and replayed like a decline.
    Refused(StoredResponse),
    /// Another attempt owns the record now: answer from the record.
    Fenced,
}

/// Why an effect call made no effect, or may have made one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectError {
    /// A definitive refusal (a decline): nothing was made, and the answer is final.
    Declined { code: String, message: String },
    /// The outcome is unknown: the call may or may not have made the effect.
    Unavailable { reason: String },
}

impl fmt::Display for EffectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Declined { code, message } => write!(f, "declined ({code}): {message}"),
            Self::Unavailable { reason } => write!(f, "unavailable: {reason}"),
        }
    }
}

impl std::error::Error for EffectError {}

/// The definitive answer to "what did the calls under this key make?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled<E> {
    /// The effect exists.
    Exists(E),
    /// A call under the key is still being processed: ask again later.
    StillProcessing,
    /// Nothing was made, and the key is now tombstoned: nothing ever can be under it.
    Tombstoned,
}

/// The preparation of an attempt: the record it owns, and the transaction over the record,
/// which the engine begins only when the operation first asks for it
/// ([`transaction`](Self::transaction)) and commits once [`Operation::prepare`] returns
/// [`Prepared::Ready`] (a refusal holds nothing: it is dropped). An operation that writes
/// nothing to prepare (a charge) never asks, and no transaction is begun.
pub struct Preparing<'a, T> {
    records: &'a dyn RecordStore<Transaction = T>,
    owner: Owner<'a>,
    sharing: Sharing,
    transaction: Option<T>,
}

impl<T> fmt::Debug for Preparing<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Preparing")
            .field("owner", &self.owner)
            .field("begun", &self.transaction.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a, T: Send + 'static> Preparing<'a, T> {
    pub(super) fn new(
        records: &'a dyn RecordStore<Transaction = T>,
        owner: Owner<'a>,
        sharing: Sharing,
    ) -> Self {
        Self {
            records,
            owner,
            sharing,
            transaction: None,
        }
    }

    /// The transaction over the record, begun on the first call; `None` when another attempt
    /// or generation owns the record now (answer [`Prepared::Fenced`]).
    pub async fn transaction(&mut self) -> Result<Option<&mut T>, StoreFailure> {
        if self.transaction.is_none() {
            self.transaction = self
                .sharing
                .begin(self.records, self.owner, Begin::HOLDING)
                .await?;
        }
        Ok(self.transaction.as_mut())
    }

    /// The transaction, if the operation began one.
    pub(super) fn into_transaction(self) -> Option<T> {
        self.transaction
    }
}

/// One idempotent operation, such as creating a charge.
///
/// After the claim, the engine asks the operation to [`prepare`](Self::prepare) the effect
/// (a refund reserves its amount there), then calls [`effect`](Self::effect) at most once per
/// attempt, always with the record's effect key, so that the effect port deduplicates every
/// attempt of one request; [`settle`](Self::settle) is the completer's definitive question
/// under the same key, and must never create anything. The operation holds its own ports (its
/// effect port: a card processor, a mail service); its rows are written in the record store's
/// transactions, which the engine begins over the record, ends the record in and commits
/// ([`finish`](Self::finish), [`end_unmade`](Self::end_unmade)). The engine sees only these
/// methods.
#[async_trait]
pub trait Operation: Send + Sync + 'static {
    /// The validated request.
    type Request: Send + Sync;
    /// What the effect is made of, once prepared: the request itself, or what the request
    /// came to against the state it met (a refund's reserved amount).
    type Plan: Send + Sync;
    /// What the effect port reports the effect to be.
    type Effect: Send + Sync;
    /// The transaction of the record store the operation's rows live in
    /// ([`RecordStore::Transaction`]).
    type Transaction: Send;

    /// The operation's family (`charges.create`): what its keys are scoped by. Every version
    /// of the operation shares it, and with it the records, so that a retry answered by
    /// another build of a fleet mid-deploy finds the effect the first one made. What the
    /// effect means must never change under one family.
    const FAMILY: &'static str;

    /// The version of the operation's schema (the shape of its answers), kept with every
    /// response it stores. Changing the shape bumps it; the family stays.
    const VERSION: SchemaVersion;

    /// The effect's name, as metrics and logs call its calls (`charge`).
    const EFFECT: &'static str;

    /// The method and route template the request's fingerprint covers (`POST`, `/charges`):
    /// the same body sent to another endpoint under the same key is another request.
    const ROUTE: (&'static str, &'static str);

    /// The version of what the request means, which [`canonical_request`] writes. It changes
    /// only when a field changes meaning (a schema version that renames a field does not bump
    /// it): a request is never compared with a record of another request version, and is
    /// answered `KeyIncomparable` instead of a guess.
    ///
    /// [`canonical_request`]: Self::canonical_request
    const REQUEST_VERSION: u32 = 1;

    /// The validated request as JSON, in the form every version of the family shares: what the
    /// fingerprint covers, so that the same request spelled otherwise (or by another schema
    /// version) is the same request, and what is stored for the completer, which
    /// [`stored_request`](Self::stored_request) reads back.
    fn canonical_request(request: &Self::Request) -> serde_json::Value;

    /// Rebuilds the request from the canonical body stored with the record, for the completer:
    /// [`canonical_request`](Self::canonical_request)'s form, or the body as the client sent
    /// it for records from before request versions. `None` if the record holds none or it is
    /// no longer valid.
    fn stored_request(&self, body: &[u8]) -> Option<Self::Request>;

    /// Prepares the effect of `request` for the generation `owner` holds. What it holds (a
    /// reservation) it writes in `preparing`'s transaction over the record, which the engine
    /// commits with a plan that is [`Prepared::Ready`], and drops with a refusal. Called by every attempt and by the completer before it finishes, so it must be
    /// idempotent per generation: a second call returns what the first one prepared.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Self::Transaction>,
        owner: Owner<'_>,
        request: &Self::Request,
    ) -> Result<Prepared<Self::Plan>, ProtocolError>;

    /// Performs the effect under `effect_key`, or returns the one already performed under it.
    async fn effect(
        &self,
        plan: &Self::Plan,
        effect_key: &str,
    ) -> Result<Self::Effect, EffectError>;

    /// Settles `effect_key` for good: the effect made under it, "still processing", or a
    /// tombstone that makes any later effect under it impossible.
    async fn settle(&self, effect_key: &str) -> Result<Settled<Self::Effect>, EffectError>;

    /// The effect port's id of the effect, kept by the `charged` recovery point.
    fn effect_id(effect: &Self::Effect) -> String;

    /// Whether the effect port's effect is the one `plan` asked for; a mismatch is never
    /// recorded. The reason goes to the log. By default every effect confirms its plan: an
    /// operation whose effect port may answer a key with an effect other than the one asked
    /// for (another amount, a failed payment) must check it here.
    fn confirms(_effect: &Self::Effect, _plan: &Self::Plan) -> Result<(), String> {
        Ok(())
    }

    /// The stored answer to a definitive refusal by the effect port (a decline). By default
    /// a 422 problem document whose `code` is the decline's code and whose `detail` is its
    /// message.
    fn declined(&self, code: String, message: String) -> StoredResponse {
        let status = (422, "Unprocessable Content");
        StoredResponse::problem(Self::VERSION, status, &code, &message)
    }

    /// The stored answer when the effect `effect_id` was made but its rows can never be
    /// written: [`finish`](Self::finish) failed with a [`StoreFailure::refused`] (a row that
    /// breaks a constraint, a value its column cannot hold). The record is completed with this
    /// answer, keeps the effect id for an operator and is never reaped, so every retry gets
    /// this answer instead of a new attempt that fails the same way. By default a 500 problem
    /// document with the code `effect_unrecorded`.
    fn unrecorded(&self, effect_id: &str) -> StoredResponse {
        let detail = format!(
            "The {} was made ({effect_id}), but what it created could not be recorded; it is \
             kept for an operator. A retry with this key gets this answer again.",
            Self::EFFECT
        );
        let status = (500, "Internal Server Error");
        StoredResponse::problem(Self::VERSION, status, "effect_unrecorded", &detail)
    }

    /// The answer to a retry that meets a final response stored by another schema version
    /// of this operation (older during a deploy, newer during a rollback): never a second
    /// effect, only a choice of shape. The default replays `stored` as it was stored. An
    /// operation may instead render what the record created (its resource is `generation`)
    /// in its own shape; the answer still names the version that wrote the record.
    async fn replay_other_version(
        &self,
        generation: Uuid,
        stored: StoredResponse,
    ) -> Result<StoredResponse, ProtocolError> {
        let _ = generation;
        Ok(stored)
    }

    /// Writes what the operation created in `transaction` (begun to end the record `owner`
    /// holds) and returns the response to store; the engine then completes the record with it
    /// in the same transaction and commits.
    ///
    /// The store may check the fence only when the record ends
    /// ([`Begin::ENDING`](super::Begin::ENDING)): the rows of an attempt that lost its record are then
    /// written first and dropped with the transaction. They may also be refused first (the
    /// attempt that owns the record now wrote the same resource): the engine then finds the
    /// record lost (its fenced `record_effect` or `release` writes nothing) and answers from
    /// it.
    async fn finish(
        &self,
        transaction: &mut Self::Transaction,
        owner: Owner<'_>,
        plan: &Self::Plan,
        effect_id: String,
    ) -> Result<StoredResponse, ProtocolError>;

    /// Undoes in `transaction` what [`prepare`](Self::prepare) held, for a record that ends
    /// without an effect (`end` says how); the engine ends the record in the same transaction.
    /// The default does nothing, for an operation whose preparation holds nothing.
    async fn end_unmade(
        &self,
        transaction: &mut Self::Transaction,
        owner: Owner<'_>,
        end: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        let _ = (transaction, owner, end);
        Ok(())
    }
}

/// An operation whose finish can share its transaction and its commit with other requests'
/// finishes (a batch), on a store that writes batches ([`RecordBatches`](super::RecordBatches)): its
/// finish is split into [`rows`](Self::rows), what it creates as a value, made without a
/// round trip, and [`write_rows`](Self::write_rows), which writes the rows of a whole batch,
/// so that a batch costs one statement per kind of row instead of one per request.
///
/// Registered with [`Idempotent::finishing_in_batches`](super::Idempotent::finishing_in_batches).
/// [`Operation::finish`] stays the finish of a record that ends alone (the completer's, a
/// lone request's): it must write what `write_rows` writes for `rows`.
#[async_trait]
pub trait FinishesInBatches: Operation {
    /// What one finish creates, as data.
    type Rows: Send + Sync + 'static;

    /// What the finish of the effect `effect_id` for the generation `owner` holds creates, and
    /// the response to store.
    fn rows(
        &self,
        owner: Owner<'_>,
        plan: &Self::Plan,
        effect_id: String,
    ) -> Result<(Self::Rows, StoredResponse), ProtocolError>;

    /// Writes the rows of several finishes in `transaction`, in which the engine then
    /// completes each one's record, fenced: if any record is owned by another attempt now, the
    /// transaction is dropped with these rows, and each finish is written alone.
    async fn write_rows(
        &self,
        transaction: &mut Self::Transaction,
        rows: &[&Self::Rows],
    ) -> Result<(), ProtocolError>;
}
