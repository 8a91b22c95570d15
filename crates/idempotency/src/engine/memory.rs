//! An in-memory record store and response cache, for tests of the engine and for examples
//! (the `memory` feature). One process, one mutex: every call is atomic, and the clock is the
//! store's own, moved on by the caller.
//!
//! A [`MemoryTransaction`] holds its record as a database's row lock would: claims and fenced
//! writes of that record wait until it ends, and the completer's takeover passes it by. What
//! the operation writes in it (its [`EffectRow`], its holds) and the record's end are kept
//! aside and applied together at the commit; dropped, it applies nothing.
//!
//! Each call first yields once to whatever polls it, so a test that polls several engine
//! futures in turn interleaves them at every port call, as concurrent requests interleave at
//! every round trip to a database. A call waiting for a transaction yields until it ends.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use super::error::{CacheFailure, StoreFailure};
use super::ports::{
    Abandoned, Begin, CacheRead, CachedReplay, Claim, Claimed, Completion, End, Finish, Owner,
    RecordBatches, RecordStore, ResponseCache, Unmade, Verdict,
};
use crate::{
    Attempt, Fingerprint, IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, RecordState,
    RecoveryPoint, Scope, StoredResponse,
};

/// Returns `Pending` once (waking itself), then `Ready`: one interleaving point.
#[derive(Debug, Default)]
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// One interleaving point, for ports of tests (a fake effect port's call) as for this store.
pub async fn yield_once() {
    YieldOnce::default().await;
}

/// What an operation wrote with a completed record: the effect it recorded, in the same
/// atomic step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRow {
    pub scope: Scope,
    pub key: IdempotencyKey,
    /// The generation the row belongs to (the resource id).
    pub generation: Uuid,
    pub effect_id: String,
}

impl EffectRow {
    /// The row of the effect `effect_id`, made for the generation `owner` holds.
    pub fn of(owner: Owner<'_>, effect_id: String) -> Self {
        Self {
            scope: owner.scope.clone(),
            key: owner.key.clone(),
            generation: owner.fence.generation,
            effect_id,
        }
    }
}

#[derive(Debug)]
struct Stored {
    record: IdempotencyRecord,
    request_body: Vec<u8>,
}

#[derive(Debug)]
struct Inner {
    now: DateTime<Utc>,
    policy: IdempotencyPolicy,
    records: HashMap<(Scope, IdempotencyKey), Stored>,
    rows: Vec<EffectRow>,
    /// Generations holding something their end must give back (a refund's reservation).
    holds: HashSet<Uuid>,
    /// The effect keys of every record that was failed.
    failed_keys: Vec<String>,
    /// The records a transaction holds, until it ends.
    held: HashSet<RecordId>,
    /// Whether fenced writes check the fence (only a test that proves the checks catch a
    /// store without it turns this off).
    fenced: bool,
    /// Whether a transaction begun to end a record takes the record's lock and checks the
    /// fence only at its end, as the PostgreSQL store does.
    fence_at_the_end: bool,
}

type RecordId = (Scope, IdempotencyKey);

/// Idempotency records in memory.
#[derive(Debug)]
pub struct MemoryRecords {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryRecords {
    /// An empty store under `policy`, its clock at `now`.
    pub fn new(policy: IdempotencyPolicy, now: DateTime<Utc>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                now,
                policy,
                records: HashMap::new(),
                rows: Vec::new(),
                holds: HashSet::new(),
                failed_keys: Vec::new(),
                held: HashSet::new(),
                fenced: true,
                fence_at_the_end: false,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// The store, once no transaction holds the record `id`: a call on it waits, as on a row
    /// lock.
    async fn lock_unheld(&self, id: &RecordId) -> MutexGuard<'_, Inner> {
        loop {
            yield_once().await;
            if let Some(inner) = self.try_lock_unheld(id) {
                return inner;
            }
        }
    }

    fn try_lock_unheld(&self, id: &RecordId) -> Option<MutexGuard<'_, Inner>> {
        let inner = self.lock();
        (!inner.held.contains(id)).then_some(inner)
    }

    /// Moves the store's clock on.
    pub fn advance(&self, by: Duration) {
        let mut inner = self.lock();
        inner.now += delta(by);
    }

    /// Writes fenced calls without checking the fence: a broken store, for a test that shows
    /// its checks would catch one.
    pub fn without_fence(self) -> Self {
        self.lock().fenced = false;
        self
    }

    /// Begins the transactions that end records without the record's lock, which their end
    /// takes with the fence, as the PostgreSQL store does ([`Begin::ENDING`]):
    /// the operation's rows are written first, and dropped with the transaction if the
    /// fence fails.
    pub fn fencing_at_the_end(self) -> Self {
        self.lock().fence_at_the_end = true;
        self
    }

    /// A transaction over `record` for `owner`'s generation, holding the record already or not.
    fn transaction(&self, record: RecordId, owner: Owner<'_>, holding: bool) -> MemoryTransaction {
        self.transaction_over(Some(record), owner.fence.generation, holding)
    }

    /// A transaction over no record yet, for a batch of finishes: its records' ends are
    /// transactions of their own inside it (`members`).
    fn batch(&self) -> MemoryTransaction {
        self.transaction_over(None, Uuid::nil(), false)
    }

    fn transaction_over(
        &self,
        record: Option<RecordId>,
        generation: Uuid,
        holding: bool,
    ) -> MemoryTransaction {
        MemoryTransaction {
            inner: Arc::clone(&self.inner),
            record,
            generation,
            holding,
            holds: Vec::new(),
            rows: Vec::new(),
            end: None,
            members: Vec::new(),
            ended: false,
        }
    }

    /// A copy of every record.
    pub fn records(&self) -> Vec<IdempotencyRecord> {
        self.lock()
            .records
            .values()
            .map(|stored| stored.record.clone())
            .collect()
    }

    /// Every row the operations wrote with their completions.
    pub fn rows(&self) -> Vec<EffectRow> {
        self.lock().rows.clone()
    }

    /// The generations still holding something.
    pub fn holds(&self) -> HashSet<Uuid> {
        self.lock().holds.clone()
    }

    /// The effect keys of every record that was failed.
    pub fn failed_keys(&self) -> Vec<String> {
        self.lock().failed_keys.clone()
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock leaves plain data behind: still readable.
    inner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A transaction over one record (or, for a batch of finishes, over the records completed in
/// it): what an operation writes in it, and the records' ends, kept aside until the commit
/// applies them together.
#[derive(Debug)]
pub struct MemoryTransaction {
    inner: Arc<Mutex<Inner>>,
    /// The record it was begun over; none for a batch.
    record: Option<RecordId>,
    /// The generation the transaction was begun for.
    generation: Uuid,
    /// Whether it holds the record: from its beginning, or from its end for a transaction
    /// that fences at the end.
    holding: bool,
    holds: Vec<Uuid>,
    rows: Vec<EffectRow>,
    end: Option<Ending>,
    /// A batch's records, each ended in a transaction of its own, committed with it.
    members: Vec<MemoryTransaction>,
    ended: bool,
}

/// A record's end, as [`RecordStore::end`] judged it.
#[derive(Debug)]
enum Ending {
    Completed {
        response: StoredResponse,
        expires_at: DateTime<Utc>,
        /// The effect whose rows were refused for good ([`End::Unrecorded`]): the record keeps
        /// its id at the effect-made recovery point.
        unrecorded: Option<String>,
    },
    Failed {
        expires_at: DateTime<Utc>,
    },
}

impl MemoryTransaction {
    /// Holds something for the record's generation (a reservation) until the record ends;
    /// idempotent per generation.
    pub fn hold(&mut self) {
        self.holds.push(self.generation);
    }

    /// Writes an operation's row of its effect.
    pub fn insert_row(&mut self, row: EffectRow) {
        self.rows.push(row);
    }

    /// Applies everything at once and lets the records go.
    fn commit(mut self) {
        for member in self.members.drain(..) {
            member.commit();
        }
        let mut inner = lock(&self.inner);
        inner.holds.extend(self.holds.drain(..));
        inner.rows.append(&mut self.rows);
        match self.end.take() {
            Some(Ending::Completed {
                response,
                expires_at,
                unrecorded,
            }) => {
                if let Some(stored) = self
                    .record
                    .as_ref()
                    .and_then(|id| inner.records.get_mut(id))
                {
                    let record = &mut stored.record;
                    record.state = RecordState::Completed;
                    record.recovery_point = match unrecorded {
                        Some(effect_id) => {
                            record.effect_id = Some(effect_id);
                            RecoveryPoint::EffectMade
                        }
                        None => RecoveryPoint::Finished,
                    };
                    record.locked_until = None;
                    record.response = Some(response);
                    record.expires_at = expires_at;
                }
                inner.holds.remove(&self.generation);
            }
            Some(Ending::Failed { expires_at }) => {
                if let Some(stored) = self
                    .record
                    .as_ref()
                    .and_then(|id| inner.records.get_mut(id))
                {
                    let record = &mut stored.record;
                    record.state = RecordState::Failed;
                    record.locked_until = None;
                    record.expires_at = expires_at;
                    let effect_key = record.effect_key.clone();
                    inner.failed_keys.push(effect_key);
                }
                inner.holds.remove(&self.generation);
            }
            None => {}
        }
        if let (true, Some(record)) = (self.holding, &self.record) {
            inner.held.remove(record);
        }
        self.ended = true;
    }
}

impl Drop for MemoryTransaction {
    /// Rolled back: nothing kept aside is applied, and the record is let go.
    fn drop(&mut self) {
        if let (false, true, Some(record)) = (self.ended, self.holding, &self.record) {
            lock(&self.inner).held.remove(record);
        }
    }
}

fn record_of(owner: Owner<'_>) -> RecordId {
    (owner.scope.clone(), owner.key.clone())
}

fn delta(duration: Duration) -> TimeDelta {
    TimeDelta::from_std(duration).unwrap_or(TimeDelta::MAX)
}

impl Inner {
    /// The pending record `owner` still owns (unless fences are off).
    fn owned(&mut self, owner: Owner<'_>) -> Option<&mut IdempotencyRecord> {
        let fenced = self.fenced;
        let stored = self
            .records
            .get_mut(&(owner.scope.clone(), owner.key.clone()))?;
        let record = &mut stored.record;
        let owns = record.state == RecordState::Pending
            && record.generation == owner.fence.generation
            && record.attempts == owner.fence.attempt;
        (owns || !fenced).then_some(record)
    }

    fn locked_until(&self) -> DateTime<Utc> {
        self.now + delta(self.policy.lock_timeout)
    }

    fn new_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> IdempotencyRecord {
        let generation = Uuid::new_v4();
        IdempotencyRecord {
            scope: scope.clone(),
            key: key.clone(),
            fingerprint: fingerprint.to_stored(),
            state: RecordState::Pending,
            generation,
            recovery_point: RecoveryPoint::Started,
            locked_until: Some(self.locked_until()),
            attempts: Attempt(1),
            effect_key: format!("effect_{}", generation.simple()),
            effect_id: None,
            response: None,
            created_at: self.now,
            expires_at: self.now + delta(self.policy.ttl),
        }
    }
}

#[async_trait]
impl RecordStore for MemoryRecords {
    type Transaction = MemoryTransaction;

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreFailure> {
        let id = (scope.clone(), key.clone());
        let mut inner = self.lock_unheld(&id).await;
        let now = inner.now;
        let locked_until = inner.locked_until();
        let verdict = inner
            .records
            .get(&id)
            .map(|stored| Verdict::of(&stored.record, fingerprint, now));
        let fresh = |inner: &mut Inner| {
            let record = inner.new_record(scope, key, fingerprint);
            let claimed = Claimed::fresh(
                record.attempts,
                record.generation,
                record.effect_key.clone(),
            );
            let request_body = request_body.to_vec();
            inner.records.insert(
                id.clone(),
                Stored {
                    record,
                    request_body,
                },
            );
            claimed
        };
        Ok(match verdict {
            None | Some(Verdict::Absent) => Claim::Owned(fresh(&mut inner)),
            Some(Verdict::Answer(answer)) => answer,
            Some(Verdict::Replace) => {
                let claimed = fresh(&mut inner);
                Claim::Owned(Claimed::replacing(
                    claimed.attempt,
                    claimed.generation,
                    claimed.effect_key,
                ))
            }
            Some(Verdict::Resume(from)) => {
                let Some(stored) = inner.records.get_mut(&id) else {
                    return Ok(Claim::Owned(fresh(&mut inner)));
                };
                let record = &mut stored.record;
                record.attempts = Attempt(record.attempts.0 + 1);
                record.locked_until = Some(locked_until);
                Claim::Owned(Claimed::taken_over(
                    record.attempts,
                    record.generation,
                    record.effect_key.clone(),
                    from,
                    record.effect_id.clone(),
                ))
            }
        })
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreFailure> {
        yield_once().await;
        let inner = self.lock();
        let record = inner
            .records
            .get(&(scope.clone(), key.clone()))
            .map(|stored| stored.record.clone());
        Ok(record.map(|record| (record, inner.now)))
    }

    async fn record_effect(
        &self,
        owner: Owner<'_>,
        effect_id: &str,
    ) -> Result<Finish, StoreFailure> {
        let mut inner = self.lock_unheld(&record_of(owner)).await;
        let Some(record) = inner.owned(owner) else {
            return Ok(Finish::Fenced);
        };
        record.recovery_point = RecoveryPoint::EffectMade;
        record.effect_id = Some(effect_id.to_owned());
        Ok(Finish::Written)
    }

    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreFailure> {
        let mut inner = self.lock_unheld(&record_of(owner)).await;
        let now = inner.now;
        let Some(record) = inner.owned(owner) else {
            return Ok(Finish::Fenced);
        };
        record.locked_until = Some(now);
        Ok(Finish::Written)
    }

    /// Alone or not, the same: this store has no group commit.
    async fn begin(
        &self,
        owner: Owner<'_>,
        begin: Begin,
    ) -> Result<Option<MemoryTransaction>, StoreFailure> {
        if begin.ending && self.lock().fence_at_the_end {
            yield_once().await;
            return Ok(Some(self.transaction(record_of(owner), owner, false)));
        }
        let id = record_of(owner);
        let mut inner = self.lock_unheld(&id).await;
        if inner.owned(owner).is_none() {
            return Ok(None);
        }
        inner.held.insert(id.clone());
        Ok(Some(self.transaction(id, owner, true)))
    }

    async fn end(
        &self,
        transaction: &mut MemoryTransaction,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreFailure> {
        let id = record_of(owner);
        let mut inner = if transaction.holding {
            yield_once().await;
            self.lock()
        } else {
            // A transaction that fences at its end takes the record's lock here.
            self.lock_unheld(&id).await
        };
        let expires_at = inner.now + delta(inner.policy.ttl);
        let Some(record) = inner.owned(owner) else {
            return Ok(Completion::Fenced);
        };
        let ending = match end {
            End::Made(response) => Ending::Completed {
                response: response.clone(),
                expires_at,
                unrecorded: None,
            },
            // A record holding an effect id never ends without its effect.
            End::Unmade(_) if record.effect_id.is_some() => return Ok(Completion::Fenced),
            End::Unmade(Unmade::Answered(response)) => Ending::Completed {
                response: response.clone(),
                expires_at,
                unrecorded: None,
            },
            End::Unmade(Unmade::Tombstoned) => Ending::Failed { expires_at },
            End::Unrecorded {
                effect_id,
                response,
            } => Ending::Completed {
                response: response.clone(),
                expires_at,
                unrecorded: Some(effect_id.to_owned()),
            },
        };
        if !transaction.holding {
            inner.held.insert(id.clone());
            transaction.record = Some(id);
            // A batch's transaction, ending the one record of a lone finish, is over it now.
            transaction.generation = owner.fence.generation;
            transaction.holding = true;
        }
        transaction.end = Some(ending);
        Ok(Completion::Stored { expires_at })
    }

    async fn commit(&self, transaction: MemoryTransaction) -> Result<(), StoreFailure> {
        yield_once().await;
        transaction.commit();
        Ok(())
    }

    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure> {
        yield_once().await;
        let mut inner = self.lock();
        let stale_before = inner.now - delta(settle_after);
        let locked_until = inner.locked_until();
        let Inner { records, held, .. } = &mut *inner;
        let oldest = records
            .values_mut()
            .filter(|stored| {
                // A record a transaction holds is passed by, as `SKIP LOCKED` does.
                !held.contains(&(stored.record.scope.clone(), stored.record.key.clone()))
                    && stored.record.state == RecordState::Pending
                    && stored
                        .record
                        .locked_until
                        .is_some_and(|until| until < stale_before)
            })
            .min_by_key(|stored| stored.record.locked_until);
        let Some(stored) = oldest else {
            return Ok(None);
        };
        let record = &mut stored.record;
        record.attempts = Attempt(record.attempts.0 + 1);
        record.locked_until = Some(locked_until);
        Ok(Some(Abandoned {
            scope: record.scope.clone(),
            key: record.key.clone(),
            attempt: record.attempts,
            generation: record.generation,
            effect_key: record.effect_key.clone(),
            recovery_point: record.recovery_point,
            effect_id: record.effect_id.clone(),
            request_body: Some(stored.request_body.clone()),
            request_version: record.fingerprint.request_version(),
        }))
    }
}

/// Writes the finishes of several records in one transaction, as the PostgreSQL store does
/// (given to the engine with [`Engine::with_batches`](super::Engine::with_batches)): each
/// record is taken and fenced where it ends in it, and the operation's rows of those completed
/// are written after.
#[async_trait]
impl RecordBatches for MemoryRecords {
    async fn begin_batch(&self) -> Result<MemoryTransaction, StoreFailure> {
        yield_once().await;
        Ok(self.batch())
    }

    /// Each record ended in a transaction of its own inside the batch, which takes the record
    /// and checks the fence at once. A record the batch has already completed is fenced, as a
    /// second update of a row the statement already updated matches nothing.
    async fn complete_many(
        &self,
        transaction: &mut MemoryTransaction,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> Result<Vec<Completion>, StoreFailure> {
        let mut completions = Vec::with_capacity(records.len());
        for &(owner, response) in records {
            let id = record_of(owner);
            if transaction
                .members
                .iter()
                .any(|member| member.record.as_ref() == Some(&id))
            {
                completions.push(Completion::Fenced);
                continue;
            }
            let mut member = self.transaction(id, owner, false);
            let completion = self.end(&mut member, owner, End::Made(response)).await?;
            if completion != Completion::Fenced {
                transaction.members.push(member);
            }
            completions.push(completion);
        }
        Ok(completions)
    }
}

/// Final responses in memory. In-process, so nothing else can write to it: its entries need
/// no MAC.
#[derive(Debug, Default)]
pub struct MemoryCache {
    entries: Mutex<HashMap<(Scope, IdempotencyKey), CachedReplay>>,
}

impl MemoryCache {
    fn entries(&self) -> MutexGuard<'_, HashMap<(Scope, IdempotencyKey), CachedReplay>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl ResponseCache for MemoryCache {
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<CacheRead, CacheFailure> {
        yield_once().await;
        let entry = self.entries().get(&(scope.clone(), key.clone())).cloned();
        Ok(entry.map_or(CacheRead::Miss, CacheRead::Hit))
    }

    async fn put(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        generation: Uuid,
        fingerprint: &Fingerprint,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
    ) -> Result<(), CacheFailure> {
        yield_once().await;
        let entry = CachedReplay {
            generation,
            fingerprint: fingerprint.to_stored(),
            response: response.clone(),
            expires_at,
        };
        self.entries().insert((scope.clone(), key.clone()), entry);
        Ok(())
    }

    async fn forget(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), CacheFailure> {
        yield_once().await;
        self.entries().remove(&(scope.clone(), key.clone()));
        Ok(())
    }
}
