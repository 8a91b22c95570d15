//! The ports the engine works through, and what crosses them. A service implements each once
//! (its database, its cache, its metrics); the engine sees nothing else of it.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::error::{CacheFailure, StoreFailure};
use super::recent::RecentAnswersHeld;
use crate::{Attempt, Fingerprint, IdempotencyKey, IdempotencyRecord, RecoveryPoint, Scope};
use crate::{StoredResponse, decide};

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This attempt owns the record and must drive it to an end.
    Owned(Claimed),
    /// The key already has a final response: send it again (and it may be cached until the
    /// record expires).
    Replay {
        response: StoredResponse,
        /// The record's generation, which a cached copy of the response is bound to.
        generation: Uuid,
        expires_at: DateTime<Utc>,
    },
    /// Another attempt holds the lock.
    InFlight { retry_after_secs: u64 },
    /// The key belongs to a different request.
    Mismatch,
    /// The key belongs to a request of another request version, which cannot be compared.
    Incomparable,
}

/// What every write of an owning attempt is conditioned on: the record's generation (the id
/// of the resource its request creates, new whenever the key starts a new request) and the
/// attempt number within it.
/// The attempt alone is not enough: a record that is reaped and claimed again restarts at
/// attempt 1, and a straggler of the old generation must not pass the new one's fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub attempt: Attempt,
    pub generation: Uuid,
}

/// The record an attempt owns, and the fence it writes under: every write after the claim
/// names its record with this one value.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub scope: &'a Scope,
    pub key: &'a IdempotencyKey,
    pub fence: Fence,
}

impl<'a> Owner<'a> {
    pub fn new(scope: &'a Scope, key: &'a IdempotencyKey, fence: Fence) -> Self {
        Self { scope, key, fence }
    }
}

/// What an owning attempt needs to execute or resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The attempt number, half of this attempt's [`Fence`].
    pub attempt: Attempt,
    /// The record's generation: the id of the resource this request creates, the same on
    /// every attempt of it; the other half of the fence.
    pub generation: Uuid,
    /// The key the effect is made under, the same on every attempt of the generation.
    pub effect_key: String,
    pub resume_from: RecoveryPoint,
    /// Known when resuming from `charged`.
    pub effect_id: Option<String>,
    /// Whether an earlier attempt had the record (a takeover of an abandoned attempt).
    pub took_over: bool,
    /// Whether the claim reused the row of an earlier generation (an expired or failed
    /// record): a cached copy of that generation's response must go.
    pub replaced: bool,
}

impl Claimed {
    /// A new request under the key, in `generation`: it starts from the beginning.
    pub fn fresh(attempt: Attempt, generation: Uuid, effect_key: String) -> Self {
        Self {
            attempt,
            generation,
            effect_key,
            resume_from: RecoveryPoint::Started,
            effect_id: None,
            took_over: false,
            replaced: false,
        }
    }

    /// A new generation in the row of an expired or failed record.
    pub fn replacing(attempt: Attempt, generation: Uuid, effect_key: String) -> Self {
        Self {
            replaced: true,
            ..Self::fresh(attempt, generation, effect_key)
        }
    }

    /// The same request, taken over from an earlier attempt: it resumes where that one left it.
    pub fn taken_over(
        attempt: Attempt,
        generation: Uuid,
        effect_key: String,
        from: RecoveryPoint,
        effect_id: Option<String>,
    ) -> Self {
        Self {
            resume_from: from,
            effect_id,
            took_over: true,
            ..Self::fresh(attempt, generation, effect_key)
        }
    }

    /// The fence every later write of this attempt carries.
    pub fn fence(&self) -> Fence {
        Fence {
            attempt: self.attempt,
            generation: self.generation,
        }
    }
}

/// Whether a fenced write that completes the record took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The record is completed; its retention, counted from now, ends at `expires_at`.
    Stored { expires_at: DateTime<Utc> },
    /// Another attempt or generation owns the record: nothing was written.
    Fenced,
}

impl Completion {
    /// From what a completing statement returned: the new expiry, or no row at all (fenced).
    pub fn from_expiry(expires_at: Option<DateTime<Utc>>) -> Self {
        match expires_at {
            Some(expires_at) => Self::Stored { expires_at },
            None => Self::Fenced,
        }
    }
}

/// Whether a fenced write took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The record still belonged to this attempt and was written.
    Written,
    /// Another attempt took the record over: nothing was written, and this attempt must answer
    /// from the record as it now is.
    Fenced,
}

impl Finish {
    /// From the number of rows a fenced statement changed.
    pub fn from_rows(rows: u64) -> Self {
        if rows == 1 {
            Self::Written
        } else {
            Self::Fenced
        }
    }
}

/// A pending record the completer took over, with what it needs to settle it.
#[derive(Debug, Clone)]
pub struct Abandoned {
    pub scope: Scope,
    pub key: IdempotencyKey,
    /// The completer's own attempt number: the record's attempts after the takeover.
    pub attempt: Attempt,
    pub generation: Uuid,
    pub effect_key: String,
    pub recovery_point: RecoveryPoint,
    pub effect_id: Option<String>,
    /// The canonical JSON of the request, to finish it without the client.
    pub request_body: Option<Vec<u8>>,
    /// The request version `request_body` was written in ([`crate::AS_SENT`]: the body as
    /// the client sent it, before request versions).
    pub request_version: u32,
}

impl Abandoned {
    /// The fence the completer's writes carry.
    pub fn fence(&self) -> Fence {
        Fence {
            attempt: self.attempt,
            generation: self.generation,
        }
    }

    /// The record the completer now owns.
    pub fn owner(&self) -> Owner<'_> {
        Owner {
            scope: &self.scope,
            key: &self.key,
            fence: self.fence(),
        }
    }
}

/// How a record ends when no effect was made under its key.
#[derive(Debug, Clone, Copy)]
pub enum Unmade<'a> {
    /// With a final answer that created nothing: a decline, or a refusal by the operation's
    /// preparation. Stored and replayed like a success.
    Answered(&'a StoredResponse),
    /// Failed, once the effect port has tombstoned the key: nothing was made, and nothing can be.
    /// The next retry starts a new generation under a new effect key.
    Tombstoned,
}

/// How the engine ends a record, in the transaction its operation wrote in.
#[derive(Debug, Clone, Copy)]
pub enum End<'a> {
    /// Completed with the response of the effect whose rows the operation wrote.
    Made(&'a StoredResponse),
    /// Ended without an effect. A record that holds an effect id never ends this way: its
    /// effect must reach the operation's rows.
    Unmade(Unmade<'a>),
    /// Completed with `response`, the effect `effect_id` made but its rows refused for good
    /// by the store (a finish no retry can change): the record keeps the effect's id and its
    /// effect-made recovery point for an operator, replays `response` to every retry, and is
    /// never reaped.
    Unrecorded {
        effect_id: &'a str,
        response: &'a StoredResponse,
    },
}

/// The idempotency records: the claim, the lock-free read, the fenced writes of the attempt
/// that owns a record, the takeover of abandoned ones, and the transaction a record ends in.
///
/// The engine ends every record in a [`Transaction`](Self::Transaction) of the store: it
/// begins one to end the record ([`Begin::ENDING`]), the operation writes
/// its own rows in it, and the engine ends the record in it ([`end`](Self::end)) and commits.
/// So an operation's rows exist exactly when its record is completed, and no operation writes
/// the record itself. A preparation (a reservation) is written in a transaction begun over
/// the record ([`begin`](Self::begin)), which the engine commits without ending the record.
///
/// Every implementation keeps these promises:
/// - of any number of concurrent claims of one key, exactly one owns it;
/// - every write after the claim is fenced by [`Owner::fence`] and writes nothing once
///   another attempt or generation owns the record;
/// - a transaction begun over a record holds it: no claim, takeover or fenced write changes
///   the record until the transaction ends, and a dropped transaction writes nothing; a
///   transaction begun to end a record ([`Begin::ENDING`]) may instead
///   hold it from its end on, which writes nothing for an owner that lost the record;
/// - a record that holds an effect id is never ended without an effect;
/// - lock expiry is judged by the store's clock, never by an instance's.
#[async_trait]
pub trait RecordStore: Send + Sync + 'static {
    /// A transaction of the store, begun over one record: what an operation writes its rows
    /// in, beside the record's end. Dropped uncommitted, it writes nothing.
    type Transaction: Send;

    /// Claims `key` for a request with `fingerprint`, or says why this attempt may not run.
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreFailure>;

    /// Reads a record and the store's clock, without locking.
    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreFailure>;

    /// Records that the effect port confirmed the effect (the `charged` recovery point), so
    /// that a takeover resumes from here.
    async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, StoreFailure>;

    /// Gives up the lock after an unknown outcome: the record stays pending and becomes stale
    /// at once, so the next retry resumes it and, if nobody retries, the completer settles it.
    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreFailure>;

    /// Begins a transaction over the record `owner` holds, for what `begin` says; `None`,
    /// with nothing begun, when another attempt or generation owns the record.
    ///
    /// For a preparation ([`Begin::HOLDING`]) the transaction holds the record until it ends.
    /// For a transaction the engine ends the record in, after the operation wrote its rows
    /// ([`Begin::ENDING`]), a store may instead leave the fence to [`end`](Self::end), where a
    /// lock costs a round trip of its own: the transaction then holds nothing until `end`,
    /// which takes the record's lock and checks the fence at once and, for an owner that lost
    /// the record, writes nothing; the engine then drops the transaction with the operation's
    /// rows. A store that commits several records' transactions together (a group commit)
    /// fails them all with [`StoreFailure::is_batch_failed`] when that commit fails, having
    /// written nothing; the engine then begins each one again [`Begin::alone`], with a commit
    /// it shares with no other, so that one bad row fails one request.
    async fn begin(
        &self,
        owner: Owner<'_>,
        begin: Begin,
    ) -> Result<Option<Self::Transaction>, StoreFailure>;

    /// Ends the record `owner` holds as `end` says, in `transaction` (begun over it). Its
    /// retention, counted from now, ends at the returned expiry. [`Completion::Fenced`] when
    /// the record may not end that way (it holds an effect id, and `end` made none): the
    /// engine then drops the transaction.
    async fn end(
        &self,
        transaction: &mut Self::Transaction,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreFailure>;

    /// Commits `transaction`: the operation's rows and the record's end, all or nothing.
    async fn commit(&self, transaction: Self::Transaction) -> Result<(), StoreFailure>;

    /// Takes over one pending record whose lock ended at least `settle_after` ago, oldest
    /// first, fencing off its last attempt.
    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure>;
}

/// What a transaction over a record is begun for ([`RecordStore::begin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// To end the record in: the store may leave the fence to the end.
    pub ending: bool,
    /// With a commit of its own, shared with no other record's transaction.
    pub alone: bool,
}

impl Begin {
    /// For a preparation: the transaction holds the record from its beginning.
    pub const HOLDING: Self = Self {
        ending: false,
        alone: false,
    };
    /// For a finish, or an end without an effect: the record is ended in it.
    pub const ENDING: Self = Self {
        ending: true,
        alone: false,
    };

    /// The same, with a commit shared with no other: the second try after a shared commit
    /// failed.
    pub const fn alone(self) -> Self {
        Self {
            alone: true,
            ..self
        }
    }
}

/// A record store that writes the finishes of several records in one transaction and one
/// commit: the engine, given one ([`Engine::with_batches`](super::Engine::with_batches)),
/// queues the concurrent finishes of an operation that
/// [`FinishesInBatches`](super::FinishesInBatches). Its own conformance checks are
/// `conformance::batches`.
#[async_trait]
pub trait RecordBatches: RecordStore {
    /// Begins a transaction over no record yet, in which the finishes of one or several
    /// records are written together (their operation's rows, then the records ended with
    /// [`end`](RecordStore::end) for one, [`complete_many`](Self::complete_many) for several)
    /// and committed once. Every finish of the operation waits behind this transaction, so a
    /// store should have it wait only briefly for anything another transaction holds, and
    /// fail as [`StoreFailure::busy`] past that: the engine then writes each of its finishes
    /// alone.
    async fn begin_batch(&self) -> Result<Self::Transaction, StoreFailure>;

    /// Completes each of `records` with its response in `transaction` (begun by
    /// [`begin_batch`](Self::begin_batch)), each fenced on its own as
    /// [`end`](RecordStore::end) fences one: one [`Completion`] per record, in their order,
    /// [`Completion::Fenced`] for one that another attempt or generation owns now, which
    /// writes nothing and fails none of the others. [`complete_each`] does it one record
    /// after another, for a store with no statement of its own for a batch.
    async fn complete_many(
        &self,
        transaction: &mut Self::Transaction,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> Result<Vec<Completion>, StoreFailure>;
}

/// A cached response and the fingerprint of the request that produced it: a hit for another
/// payload is still a mismatch (422), exactly as from the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedReplay {
    /// The generation of the record the response was stored in.
    pub generation: Uuid,
    pub fingerprint: Fingerprint,
    pub response: StoredResponse,
    /// When the record's retention ends: the entry itself expires at this same instant.
    pub expires_at: DateTime<Utc>,
}

/// What a cache read found.
#[derive(Debug)]
pub enum CacheRead {
    /// An authentic entry.
    Hit(CachedReplay),
    /// No entry.
    Miss,
    /// An entry that is not one this service wrote (it failed its check): never served.
    Rejected(Box<dyn std::error::Error + Send + Sync>),
}

/// A cache of final responses in front of the records. It may make a replay faster and must
/// never make a request fail: every failure is a miss. Nothing read from it is trusted
/// unchecked: an implementation authenticates its entries and answers
/// [`CacheRead::Rejected`] for any it did not write.
#[async_trait]
pub trait ResponseCache: Send + Sync {
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<CacheRead, CacheFailure>;

    /// Stores a final response of `generation` until `expires_at`, the record's own expiry.
    async fn put(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        generation: Uuid,
        fingerprint: &Fingerprint,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
    ) -> Result<(), CacheFailure>;

    /// Removes a key's entry: its record was replaced by a new generation.
    async fn forget(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), CacheFailure>;
}

/// What the engine did with a request or an abandoned record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The attempt ran the operation and stored its answer.
    Executed,
    /// A replay served from this process's recent answers.
    ReplayedMemory,
    /// A replay served from the cache.
    ReplayedCache,
    /// A replay served from the records.
    ReplayedDb,
    /// A duplicate of an attempt in flight (409, or a wait that ran out).
    InFlight,
    /// Another payload under a used key (422).
    Mismatch,
    /// A request of another request version under a used key (409).
    Incomparable,
    /// The attempt took over an abandoned record.
    TakenOver,
    /// The attempt lost its record to another and answered from it.
    Fenced,
    /// The completer finished a record whose effect the effect port had made.
    CompletedByCompleter,
    /// The completer failed a record after the effect port tombstoned its key.
    FailedByCompleter,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::ReplayedMemory => "replayed_memory",
            Self::ReplayedCache => "replayed_cache",
            Self::ReplayedDb => "replayed_db",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::Incomparable => "incomparable",
            Self::TakenOver => "taken_over",
            Self::Fenced => "fenced",
            Self::CompletedByCompleter => "completed_by_completer",
            Self::FailedByCompleter => "failed_by_completer",
        }
    }
}

/// A cache call that failed and was worked around.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheCall {
    /// Reading (the records answer instead).
    Get,
    /// Writing (the next replay reads the records).
    Put,
    /// Deleting a replaced generation's response (it expires with its record anyway).
    Forget,
}

/// The points of an attempt where a test may stop or pause the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoint {
    /// The record is claimed and the effect prepared; the effect port has not been called.
    AfterClaim,
    /// The effect port made the effect; the finishing transaction has not run.
    AfterEffect,
    /// The finish failed and the attempt recorded the effect's id instead.
    AfterRecordEffect,
    /// The finishing transaction committed; the client has not been answered.
    AfterCommit,
}

/// What the engine reports as it works: outcomes and timings for metrics, and the checkpoints
/// where a crash test may stop it. Every method does nothing by default.
#[async_trait]
pub trait Observer: Send + Sync {
    /// What happened to a request or an abandoned record.
    fn outcome(&self, _outcome: Outcome) {}

    /// An operation's effect call (named by the operation's [`Operation::EFFECT`]) took
    /// `took`, whatever its result.
    ///
    /// [`Operation::EFFECT`]: super::Operation::EFFECT
    fn effect_called(&self, _effect: &'static str, _took: Duration) {}

    /// The effect port reported an effect that is not the one requested: never recorded.
    fn effect_mismatch(&self) {}

    /// A cache entry failed its check: never served.
    fn cache_rejected(&self) {}

    /// A cache call failed and was worked around.
    fn cache_failed(&self, _call: CacheCall) {}

    /// A batch of `finishes` finishes of `operation` (its [`Operation::FAMILY`]) was written
    /// ([`FinishesInBatches`]): one for a finish written alone, with no other waiting.
    ///
    /// [`Operation::FAMILY`]: super::Operation::FAMILY
    /// [`FinishesInBatches`]: super::FinishesInBatches
    fn finishes_written(&self, _operation: &'static str, _finishes: usize) {}

    /// An effect of `operation` was made but its rows were refused for good: its record was
    /// completed with the operation's `unrecorded` answer and kept for an operator.
    fn effect_unrecorded(&self, _operation: &'static str) {}

    /// The completer took over an abandoned record and began to settle it.
    fn settle_began(&self) {}

    /// The completer is done with a record it began to settle, however that ended.
    fn settle_ended(&self) {}

    /// What this process's recent answers hold, after one was added.
    fn recent_answers(&self, _held: RecentAnswersHeld) {}

    /// The attempt reached `point`.
    async fn reached(&self, _point: Checkpoint) {}
}

/// An observer that observes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl Observer for Unobserved {}

/// Judges an existing record as [`decide`] does, for a store's claim: the answer to give at
/// once, or what the claim must do under its lock.
#[derive(Debug)]
pub enum Verdict {
    /// Answer without executing: a replay, in flight, or a mismatch.
    Answer(Claim),
    /// Take the record over and resume it from this point.
    Resume(RecoveryPoint),
    /// Reuse the row for a new generation: the record expired, or failed for good.
    Replace,
    /// Treated as absent (never for a record that exists).
    Absent,
}

impl Verdict {
    /// What a claim with `fingerprint` does with `record` at the store's time `now`.
    pub fn of(record: &IdempotencyRecord, fingerprint: &Fingerprint, now: DateTime<Utc>) -> Self {
        use crate::Decision;
        match decide(Some(record), fingerprint, now) {
            Decision::Replay(response) => Self::Answer(Claim::Replay {
                response,
                generation: record.generation,
                expires_at: record.expires_at,
            }),
            Decision::InFlight { retry_after_secs } => {
                Self::Answer(Claim::InFlight { retry_after_secs })
            }
            Decision::Mismatch => Self::Answer(Claim::Mismatch),
            Decision::Incomparable => Self::Answer(Claim::Incomparable),
            Decision::Resume { from } => Self::Resume(from),
            Decision::ReplaceExpired | Decision::RetryFailed => Self::Replace,
            Decision::Execute => Self::Absent,
        }
    }
}

/// Completes each of `records` in `transaction` with [`RecordStore::end`], one after another:
/// [`RecordBatches::complete_many`] for a store with no statement for a batch.
pub async fn complete_each<S: RecordStore + ?Sized>(
    store: &S,
    transaction: &mut S::Transaction,
    records: &[(Owner<'_>, &StoredResponse)],
) -> Result<Vec<Completion>, StoreFailure> {
    let mut completions = Vec::with_capacity(records.len());
    for &(owner, response) in records {
        completions.push(store.end(transaction, owner, End::Made(response)).await?);
    }
    Ok(completions)
}
