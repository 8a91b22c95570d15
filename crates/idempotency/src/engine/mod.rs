//! The exactly-once engine, written once for every operation:
//!
//! 0. a replay may be served from this process's recent answers ([`RecentAnswers`]) or the
//!    cache (fingerprint checked, 422 on mismatch);
//! 1. claim the key (insert, or judge the existing record; a lock only to take it over);
//! 2. prepare the effect for the record's generation (a refund reserves its amount), or store
//!    the final answer the state it meets calls for;
//! 3. perform the operation's effect with the record's effect key, the same on every attempt,
//!    and check that the effect is the one asked for;
//! 4. in one transaction of the record store, begun over the record, the operation writes
//!    what it created ([`Operation::finish`]) and the engine completes the record with its
//!    response and commits; cache the response; only then answer. A decline, a refusal and
//!    the completer's failure end the record the same way, in a transaction in which the
//!    operation undoes what its preparation holds ([`Operation::end_unmade`]).
//!
//! The `charged` recovery point is written only when the finish fails, to leave the effect's
//! id behind (and the lock is released with it, for the retry); an attempt that dies before the
//! finish is recovered through the effect key instead. Every write after the claim is fenced by the record's generation and attempt
//! number: if another attempt took the record over meanwhile, this one writes nothing and
//! answers from the record as it is.
//!
//! The engine works only through its ports ([`RecordStore`], [`ResponseCache`],
//! [`Observer`]), the operations registered with it and its recent answers, held in memory;
//! it knows no web framework, database or cache of its own. The completer runs the same steps without a client
//! ([`Engine::settle_abandoned`]).

mod batch;
mod cache;
mod completer;
mod completions;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
#[cfg(any(test, feature = "memory"))]
pub mod memory;
mod operation;
mod ports;
mod recent;
mod settle;
mod transaction;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use batch::{Batches, FinishQueue};
pub use completer::{Completer, CompleterSettings};
pub use completions::Completions;
pub use error::{CacheFailure, ProtocolError, StoreFailure, error_chain};
pub use operation::{EffectError, FinishesInBatches, Operation, Prepared, Preparing, Settled};
pub use ports::{
    Abandoned, Begin, CacheCall, CacheRead, CachedReplay, Checkpoint, Claim, Claimed, Completion,
    End, Fence, Finish, Observer, Outcome, Owner, RecordBatches, RecordStore, ResponseCache,
    Unmade, Unobserved, Verdict, complete_each,
};
pub use recent::{RecentAnswers, RecentAnswersHeld};
pub use settle::SettleOutcome;
use transaction::Ended;

use crate::{
    Decision, Fingerprint, IdempotencyKey, RecentDurations, RecoveryPoint, SchemaVersion, Scope,
    StoredResponse, decide,
};

/// A validated request under its key, ready for the engine.
#[derive(Debug)]
pub struct KeyedRequest<R> {
    /// Whose key it is: the same key under another tenant is another key.
    pub tenant: String,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    /// The canonical JSON of the request, kept so the completer can finish it.
    pub canonical_body: Vec<u8>,
    pub request: R,
    /// `Prefer: wait=N`: how long a duplicate may wait for an in-flight attempt.
    pub wait: Option<Duration>,
    /// The request exactly as it was sent, if the adapter told: an answer to it, or a replay
    /// judged the same, is held with it, so that a retry of the same bytes is answered from
    /// memory before it is parsed ([`Engine::replay_verbatim`]).
    pub verbatim: Option<crate::Verbatim>,
}

/// What to send back: a response produced now or stored earlier, which schema version wrote
/// the record, and when the key's retention ends (counted from the record's completion).
#[derive(Debug)]
pub struct Answer {
    pub response: StoredResponse,
    pub replayed: bool,
    /// The schema version of the operation that wrote the record's response; a replay by
    /// another version may render it in its own shape ([`Operation::replay_other_version`]).
    pub written_by: SchemaVersion,
    pub expires_at: DateTime<Utc>,
}

impl Answer {
    fn fresh(response: StoredResponse, expires_at: DateTime<Utc>) -> Self {
        Self {
            written_by: response.schema_version,
            response,
            replayed: false,
            expires_at,
        }
    }
}

/// An operation with what the engine keeps for it: how long its recent attempts took, for
/// the `Retry-After` of a duplicate.
#[derive(Debug)]
pub struct Idempotent<O: Operation> {
    operation: O,
    durations: RecentDurations,
    /// The queue its finishes are written in batches from, on a store that writes batches.
    batches: Option<Box<dyn Batches<O>>>,
}

impl<O: Operation> Idempotent<O> {
    pub fn new(operation: O) -> Self {
        Self {
            operation,
            durations: RecentDurations::default(),
            batches: None,
        }
    }
}

impl<O: FinishesInBatches> Idempotent<O>
where
    O::Transaction: 'static,
{
    /// `operation`, whose concurrent finishes share one transaction and one commit on a store
    /// that writes batches ([`Engine::with_batches`]); on any other, the same as
    /// [`new`](Self::new).
    pub fn finishing_in_batches(operation: O) -> Self {
        Self {
            batches: Some(Box::<FinishQueue<O>>::default()),
            ..Self::new(operation)
        }
    }
}

impl<O: Operation> std::ops::Deref for Idempotent<O> {
    type Target = O;

    fn deref(&self) -> &O {
        &self.operation
    }
}

/// The scope of a key of `O`: the same key under another tenant or operation is another key,
/// and under another version of `O` the same key.
pub fn scope_of<O: Operation>(tenant: &str) -> Scope {
    Scope {
        tenant: tenant.to_owned(),
        operation: O::FAMILY.to_owned(),
    }
}

/// The fingerprint of `request` to `O`, sent as `as_sent`: its route and its canonical request
/// ([`Operation::canonical_request`]) under `O`'s request version, and its body as sent for
/// records from before request versions.
pub fn fingerprint_of<O: Operation>(
    request: &O::Request,
    as_sent: &serde_json::Value,
) -> Fingerprint {
    fingerprint_of_canonical::<O>(&O::canonical_request(request), as_sent)
}

/// [`fingerprint_of`] for a request already in its canonical form.
fn fingerprint_of_canonical<O: Operation>(
    canonical: &serde_json::Value,
    as_sent: &serde_json::Value,
) -> Fingerprint {
    let (method, route) = O::ROUTE;
    Fingerprint::of_request(O::REQUEST_VERSION, method, route, canonical, as_sent)
}

impl<R> KeyedRequest<R> {
    /// `tenant`'s `request` to `O` under `key`: its fingerprint and the canonical body to
    /// store, from `O`'s canonical form of the request.
    pub fn of<O: Operation<Request = R>>(
        tenant: String,
        key: IdempotencyKey,
        request: R,
        wait: Option<Duration>,
    ) -> Self {
        let canonical = O::canonical_request(&request);
        let (method, route) = O::ROUTE;
        Self {
            tenant,
            key,
            fingerprint: Fingerprint::of_validated(O::REQUEST_VERSION, method, route, &canonical),
            canonical_body: crate::canonical_json(&canonical).into_bytes(),
            request,
            wait,
            verbatim: None,
        }
    }

    /// [`of`](Self::of), the client having sent `as_sent`: for a service that holds records
    /// from before request versions, which were fingerprinted over the body as sent
    /// ([`AS_SENT`](crate::AS_SENT)), so that a retry of one is still compared with it.
    pub fn of_sent<O: Operation<Request = R>>(
        tenant: String,
        key: IdempotencyKey,
        request: R,
        as_sent: &serde_json::Value,
        wait: Option<Duration>,
    ) -> Self {
        let canonical = O::canonical_request(&request);
        Self {
            tenant,
            key,
            fingerprint: fingerprint_of_canonical::<O>(&canonical, as_sent),
            canonical_body: crate::canonical_json(&canonical).into_bytes(),
            request,
            wait,
            verbatim: None,
        }
    }

    /// The same request, sent as `verbatim`.
    pub fn sent_as(self, verbatim: crate::Verbatim) -> Self {
        Self {
            verbatim: Some(verbatim),
            ..self
        }
    }
}

/// An operation as the completer sees it: whatever its types, it settles a record.
#[async_trait]
trait Settles<T>: Send + Sync {
    async fn settle(
        &self,
        engine: &Engine<T>,
        record: &Abandoned,
    ) -> Result<SettleOutcome, ProtocolError>;
}

#[async_trait]
impl<O: Operation> Settles<O::Transaction> for Idempotent<O> {
    async fn settle(
        &self,
        engine: &Engine<O::Transaction>,
        record: &Abandoned,
    ) -> Result<SettleOutcome, ProtocolError> {
        engine.settle(self, record).await
    }
}

/// The engine over a record store whose transactions are `T`: the records, the cache, the
/// observer, the in-process completion channel, and the operations it settles, by family.
pub struct Engine<T> {
    records: Arc<dyn RecordStore<Transaction = T>>,
    /// The same store, when it writes the finishes of several records together.
    batches: Option<Arc<dyn RecordBatches<Transaction = T>>>,
    recent: Option<RecentAnswers>,
    cache: Option<Arc<dyn ResponseCache>>,
    observer: Arc<dyn Observer>,
    completions: Completions,
    operations: HashMap<&'static str, Arc<dyn Settles<T>>>,
}

impl<T> fmt::Debug for Engine<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("recent", &self.recent.as_ref().map(RecentAnswers::capacity))
            .field("cache", &self.cache.is_some())
            .field("operations", &self.operation_names())
            .finish_non_exhaustive()
    }
}

impl<T> Engine<T> {
    /// The families of the registered operations, in order.
    pub fn operation_names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.operations.keys().copied().collect();
        names.sort_unstable();
        names
    }

    /// The scope of `tenant`'s keys of the registered operation family `operation`; `None`
    /// for a family no registered operation has.
    pub fn scope_named(&self, operation: &str, tenant: &str) -> Option<Scope> {
        self.operations.contains_key(operation).then(|| Scope {
            tenant: tenant.to_owned(),
            operation: operation.to_owned(),
        })
    }
}

impl<T: Send + 'static> Engine<T> {
    /// An engine over `records`, with no cache, observing nothing, settling no operation.
    pub fn new(records: Arc<dyn RecordStore<Transaction = T>>) -> Self {
        Self {
            records,
            batches: None,
            recent: None,
            cache: None,
            observer: Arc::new(Unobserved),
            completions: Completions::default(),
            operations: HashMap::new(),
        }
    }

    /// Holds the final answers this process gives or replays in `recent`, and serves replays
    /// from it before the cache and the records.
    pub fn with_recent_answers(mut self, recent: RecentAnswers) -> Self {
        self.recent = Some(recent);
        self
    }

    /// Serves replays from `cache` first (after this process's recent answers), and stores
    /// final responses in it.
    pub fn with_cache(mut self, cache: Arc<dyn ResponseCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Ends records in `records`, which also writes the finishes of several records in one
    /// transaction: the finishes of an operation that [`FinishesInBatches`] are queued and
    /// written together ([`Idempotent::finishing_in_batches`]).
    pub fn with_batches(mut self, records: Arc<dyn RecordBatches<Transaction = T>>) -> Self {
        self.records = Arc::clone(&records) as Arc<dyn RecordStore<Transaction = T>>;
        self.batches = Some(records);
        self
    }

    /// The store that writes batches, for a finish the queue holds.
    fn batch_store(&self) -> Result<&dyn RecordBatches<Transaction = T>, ProtocolError> {
        let store = self.batches.as_deref();
        store.ok_or_else(|| ProtocolError::Internal("the engine has no store of batches".into()))
    }

    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Registers `op`, so that the completer settles its abandoned records, whichever
    /// version of its family claimed them ([`settle_abandoned`](Self::settle_abandoned)).
    pub fn with_operation<O: Operation<Transaction = T>>(mut self, op: Arc<Idempotent<O>>) -> Self {
        self.operations.insert(O::FAMILY, op);
        self
    }

    /// Runs `request` of `op` through the protocol.
    pub async fn run<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        request: KeyedRequest<O::Request>,
    ) -> Result<Answer, ProtocolError> {
        if let Some(answer) = self.replay_cached(op, &request).await {
            return answer;
        }
        self.run_past_caches(op, request).await
    }

    /// Runs `request` of `op` through the protocol from its claim on, without asking the
    /// caches: for a caller that asked them first ([`replay_cached`](Self::replay_cached)).
    /// Past the claim an attempt writes, so a caller that may stop waiting runs this on a task
    /// of its own.
    pub async fn run_past_caches<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        request: KeyedRequest<O::Request>,
    ) -> Result<Answer, ProtocolError> {
        let scope = scope_of::<O>(&request.tenant);
        let deadline = request.wait.map(|wait| tokio::time::Instant::now() + wait);
        loop {
            // Subscribe before claiming, so a completion between the two is not missed.
            let mut completions = self.completions.subscribe();
            let claim = self
                .records
                .claim(
                    &scope,
                    &request.key,
                    &request.fingerprint,
                    &request.canonical_body,
                )
                .await?;
            return match claim {
                Claim::Replay {
                    response,
                    generation,
                    expires_at,
                } => {
                    self.observer.outcome(Outcome::ReplayedDb);
                    self.remember(&scope, &request, generation, &response, expires_at)
                        .await;
                    self.replay(op, generation, response, expires_at).await
                }
                Claim::InFlight { retry_after_secs } => match deadline {
                    Some(deadline) if tokio::time::Instant::now() < deadline => {
                        self.completions
                            .wait_for(&mut completions, &scope, &request.key, deadline)
                            .await;
                        continue;
                    }
                    _ => {
                        self.observer.outcome(Outcome::InFlight);
                        Err(in_use(op, retry_after_secs))
                    }
                },
                Claim::Mismatch => {
                    self.observer.outcome(Outcome::Mismatch);
                    Err(ProtocolError::KeyReused)
                }
                Claim::Incomparable => {
                    self.observer.outcome(Outcome::Incomparable);
                    Err(ProtocolError::KeyIncomparable)
                }
                Claim::Owned(claimed) => {
                    if claimed.took_over {
                        self.observer.outcome(Outcome::TakenOver);
                    }
                    if claimed.replaced {
                        self.forget(&scope, &request.key).await;
                    }
                    tracing::info!(
                        idempotency.operation = O::FAMILY,
                        idempotency.schema_version = O::VERSION.get(),
                        idempotency.attempt = claimed.attempt.0,
                        idempotency.resume_from = %claimed.resume_from,
                        idempotency.took_over = claimed.took_over,
                        "executing"
                    );
                    let started = Instant::now();
                    let answer = self.execute(op, &scope, &request, claimed).await;
                    if matches!(&answer, Ok(answer) if !answer.replayed) {
                        // What a duplicate arriving meanwhile is told to wait for.
                        op.durations.record(started.elapsed());
                    }
                    answer
                }
            };
        }
    }

    /// Takes over one abandoned record (see [`RecordStore::take_over_abandoned`]).
    pub async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, ProtocolError> {
        Ok(self.records.take_over_abandoned(settle_after).await?)
    }

    /// Settles an abandoned record with the registered operation of its family, whichever
    /// version claimed it. A record of a family this engine does not know is left alone
    /// (released), never failed: it may hold an effect.
    pub async fn settle_abandoned(
        &self,
        record: &Abandoned,
    ) -> Result<SettleOutcome, ProtocolError> {
        match self.operations.get(record.scope.operation.as_str()) {
            Some(op) => op.settle(self, record).await,
            None => {
                tracing::error!(idempotency.key = %record.key, idempotency.operation = %record.scope.operation,
                    "completer: a record of an unknown operation; left pending");
                self.release(record.owner())
                    .await
                    .map(|()| SettleOutcome::Released)
            }
        }
    }

    /// Steps 2 to 4 for the attempt that owns the record.
    async fn execute<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        scope: &Scope,
        request: &KeyedRequest<O::Request>,
        claimed: Claimed,
    ) -> Result<Answer, ProtocolError> {
        let owner = Owner {
            scope,
            key: &request.key,
            fence: claimed.fence(),
        };
        let plan = match self.prepare(&op.operation, owner, &request.request).await? {
            Prepared::Ready(plan) => plan,
            Prepared::Refused(response) => {
                return self.answer_final(op, request, owner, response).await;
            }
            Prepared::Fenced => return self.answer_from_record(op, scope, request).await,
        };
        self.observer.reached(Checkpoint::AfterClaim).await;
        let (effect_id, recorded) = match (claimed.resume_from, claimed.effect_id) {
            // The effect port already confirmed the effect: do not call it again.
            (RecoveryPoint::EffectMade | RecoveryPoint::Finished, Some(id)) => (id, true),
            _ => {
                let started = Instant::now();
                let effect = op.effect(&plan, &claimed.effect_key).await;
                self.observer.effect_called(O::EFFECT, started.elapsed());
                match effect {
                    Ok(effect) => {
                        self.observer.reached(Checkpoint::AfterEffect).await;
                        if !self.confirms::<O>(&effect, &plan) {
                            // Never recorded: the record stays pending and released, for the
                            // completer (and a person reading the metric) to look at again.
                            self.release(owner).await?;
                            return Err(ProtocolError::EffectUnavailable);
                        }
                        // No `charged` write here: the finish records the effect, and an
                        // attempt that dies before it is recovered by the effect key (a
                        // retry's effect returns the same one; the completer's settle too).
                        (O::effect_id(&effect), false)
                    }
                    Err(EffectError::Declined { code, message }) => {
                        // A decline is a final answer: stored and replayed like a success.
                        let response = op.declined(code, message);
                        return self.answer_final(op, request, owner, response).await;
                    }
                    Err(EffectError::Unavailable { reason }) => {
                        // The outcome is unknown (a timeout may hide an effect): nothing final
                        // is stored and the lock is released. A retry resumes with the same
                        // effect key; if none comes, the completer settles the record once
                        // the settle grace has passed.
                        tracing::warn!(effect.error = %reason, "the effect's outcome is unknown");
                        self.release(owner).await?;
                        return Err(ProtocolError::EffectUnavailable);
                    }
                }
            }
        };
        let id = effect_id.clone();
        let finished = match &op.batches {
            Some(batches) if self.batches.is_some() => {
                batches.finish(self, &op.operation, owner, &plan, id).await
            }
            _ => self.finish(&op.operation, owner, &plan, id).await,
        };
        let finished = self
            .unless_refused(&op.operation, owner, &effect_id, finished)
            .await;
        match finished {
            Ok(ended) => {
                if let Ended::Stored { .. } = ended {
                    self.observer.reached(Checkpoint::AfterCommit).await;
                }
                self.answer_stored(op, request, owner, ended).await
            }
            Err(error) => {
                let left = self.leave_effect_behind(owner, &effect_id, recorded).await;
                if left == Some(Finish::Fenced) {
                    // Another attempt owns the record now: its rows may be why this finish
                    // failed (the same charge, already written). Its answer is the answer.
                    return self.answer_from_record(op, owner.scope, request).await;
                }
                Err(error)
            }
        }
    }

    /// Ends the record with a final answer that created nothing (a refusal, a decline), and
    /// answers with it.
    async fn answer_final<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        request: &KeyedRequest<O::Request>,
        owner: Owner<'_>,
        response: StoredResponse,
    ) -> Result<Answer, ProtocolError> {
        let end = Unmade::Answered(&response);
        let ended = match self.end_unmade(&op.operation, owner, end).await? {
            Completion::Stored { expires_at } => Ended::Stored {
                response,
                expires_at,
            },
            Completion::Fenced => Ended::Fenced,
        };
        self.answer_stored(op, request, owner, ended).await
    }

    /// The answer after the transaction that ended the record: the stored response, or, if it
    /// was fenced off, whatever the record says now.
    async fn answer_stored<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        request: &KeyedRequest<O::Request>,
        owner: Owner<'_>,
        ended: Ended,
    ) -> Result<Answer, ProtocolError> {
        let Ended::Stored {
            response,
            expires_at,
        } = ended
        else {
            return self.answer_from_record(op, owner.scope, request).await;
        };
        self.completions.announce(owner.scope, owner.key);
        self.observer.outcome(Outcome::Executed);
        let generation = owner.fence.generation;
        self.remember(owner.scope, request, generation, &response, expires_at)
            .await;
        Ok(Answer::fresh(response, expires_at))
    }

    /// Whether the effect port's effect is the one the request asked for. A mismatch is logged
    /// and observed, and never reaches the records.
    fn confirms<O: Operation>(&self, effect: &O::Effect, plan: &O::Plan) -> bool {
        let Err(mismatch) = O::confirms(effect, plan) else {
            return true;
        };
        self.observer.effect_mismatch();
        tracing::error!(
            effect.id = %O::effect_id(effect),
            error = %mismatch,
            "the effect port reported an effect that is not the one requested; it is not recorded"
        );
        false
    }

    /// Leaves the record pending with its lock released: a retry may resume it at once, and
    /// the completer settles it once the settle grace has passed.
    async fn release(&self, owner: Owner<'_>) -> Result<(), ProtocolError> {
        self.records.release(owner).await?;
        Ok(())
    }

    /// The finish failed after the effect port made the effect: record the `charged` recovery
    /// point (unless the attempt resumed from it), so that whoever resumes the record finishes
    /// it without asking the effect port again, and release the lock, so that the retry the
    /// error asks for resumes it at once instead of being told the key is in use until the
    /// lock runs out. Best effort: if these writes fail too, the effect key still finds the
    /// effect, and the lock still ends.
    ///
    /// Returns what the fenced writes came to (`Fenced`: the record was lost to another
    /// attempt meanwhile, whose rows may be why the finish failed), or `None` if one failed.
    async fn leave_effect_behind(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
        recorded: bool,
    ) -> Option<Finish> {
        if !recorded {
            match self.records.record_effect(owner, effect_id).await {
                Ok(Finish::Written) => self.observer.reached(Checkpoint::AfterRecordEffect).await,
                Ok(Finish::Fenced) => return Some(Finish::Fenced),
                Err(error) => {
                    tracing::warn!(
                        error = %error_chain(&error),
                        "could not record the charged recovery point; the effect key still finds the effect"
                    );
                    return None;
                }
            }
        }
        match self.records.release(owner).await {
            Ok(released) => Some(released),
            Err(error) => {
                tracing::warn!(error = %error_chain(&error),
                    "could not release the record after its finish failed; its lock will end");
                None
            }
        }
    }

    /// This attempt lost its record to another one: answer with whatever the record says now.
    async fn answer_from_record<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        scope: &Scope,
        request: &KeyedRequest<O::Request>,
    ) -> Result<Answer, ProtocolError> {
        self.observer.outcome(Outcome::Fenced);
        tracing::warn!("attempt was fenced off; answering from the record");
        let Some((record, now)) = self.records.find_record(scope, &request.key).await? else {
            return Err(in_use(op, 1));
        };
        match decide(Some(&record), &request.fingerprint, now) {
            Decision::Replay(response) => {
                self.replay(op, record.generation, response, record.expires_at)
                    .await
            }
            Decision::InFlight { retry_after_secs } => Err(in_use(op, retry_after_secs)),
            Decision::Mismatch => Err(ProtocolError::KeyReused),
            Decision::Incomparable => Err(ProtocolError::KeyIncomparable),
            Decision::Execute
            | Decision::Resume { .. }
            | Decision::RetryFailed
            | Decision::ReplaceExpired => Err(in_use(op, 1)),
        }
    }
}

impl<T: Send + 'static> Engine<T> {
    /// The answer of a replay of `stored`, the final response of `generation`: as stored
    /// when this version wrote it, and as the operation renders another version's otherwise.
    async fn replay<O: Operation>(
        &self,
        op: &Idempotent<O>,
        generation: uuid::Uuid,
        stored: StoredResponse,
        expires_at: DateTime<Utc>,
    ) -> Result<Answer, ProtocolError> {
        let written_by = stored.schema_version;
        let response = if written_by == O::VERSION {
            stored
        } else {
            op.replay_other_version(generation, stored).await?
        };
        Ok(Answer {
            response,
            replayed: true,
            written_by,
            expires_at,
        })
    }
}

/// 409 for a duplicate of an attempt in flight. `Retry-After` says when the answer is likely
/// ready, from the durations of recent attempts, never later than the lock ends.
fn in_use<O: Operation>(op: &Idempotent<O>, lock_left_secs: u64) -> ProtocolError {
    ProtocolError::KeyInUse {
        retry_after_secs: op.durations.retry_after_secs(lock_left_secs),
    }
}
