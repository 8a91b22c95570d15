//! The engine under every interleaving a seed can draw: client attempts of one request under
//! one key, duplicates among them, and the completer, polled in a random order one port call
//! at a time, each run by one of two builds of a fleet mid-deploy (schema versions 1 and 2 of
//! the operation, over one store and one cache), with attempts crashed (their future dropped) at any await point, the clock moved
//! past their locks, and a processor that declines, times out before or after making the
//! effect, or cannot be reached, and a record store and cache whose calls fail now and then
//! (before they do anything, or after they did it all and the answer was lost); in half the
//! schedules the store writes the finishes of concurrent attempts in batches. After each
//! schedule the store is brought to rest (the
//! completer settles whatever is left, and the client retries once more), and the guarantees
//! are checked:
//! - at most one effect is made for the request, whatever its generations;
//! - every effect made has exactly one row, and every row is an effect made;
//! - every final answer a client received is the stored response, byte for byte, and names
//!   the version that wrote it, whichever version answered;
//! - a failed record's effect key is tombstoned at the processor;
//! - nothing a generation held outlives its record's end.
//!
//! `ENGINE_SEED` replays one run (every schedule's seed is derived from it) and
//! `ENGINE_SCHEDULES` sets how many schedules it explores.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_idempotency::engine::memory::{
    EffectRow, MemoryCache, MemoryRecords, MemoryTransaction, yield_once,
};
use payments_idempotency::engine::{
    Abandoned, Answer, Begin, CacheFailure, CacheRead, Claim, Completion, EffectError, End, Engine,
    Finish, FinishesInBatches, Idempotent, KeyedRequest, Observer, Operation, Owner, Prepared,
    Preparing, ProtocolError, RecentAnswers, RecordBatches, RecordStore, ResponseCache, Settled,
    StoreFailure, fingerprint_of, scope_of,
};
use payments_idempotency::{
    Fingerprint, IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, RecordState, SchemaVersion,
    Scope, StoredResponse, canonical_json,
};
use serde_json::json;
use uuid::Uuid;

const LOCK: Duration = Duration::from_secs(30);
const SETTLE_AFTER: Duration = Duration::from_secs(5);
const DEFAULT_SEED: u64 = 0x5eed_2026_1201;
const DEFAULT_SCHEDULES: u64 = 20_000;

/// SplitMix64: small, fast, and the same on every machine.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a fake processor does with a new call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    Succeed,
    Decline,
    /// Never reaches the processor: nothing is made.
    LostOnTheWay,
    /// Made, but the answer is lost (a timeout that hides the effect).
    LostOnTheWayBack,
    /// The key already has this effect: it is answered again.
    Replay(Payment),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Payment {
    id: String,
    amount: u64,
}

#[derive(Debug, Default)]
struct Processor {
    /// The one effect under each key.
    effects: HashMap<String, Payment>,
    declined: HashSet<String>,
    /// Calls under each key that reached the processor and have not finished.
    processing: HashMap<String, usize>,
    tombstones: HashSet<String>,
    made: Vec<Payment>,
    /// What happened at the processor, in order, for a broken schedule's report.
    log: Vec<String>,
}

/// A card processor in memory: one effect per key, a call under a key finishes at the
/// processor even when its caller is gone, and a cancel tombstones a key with no effect.
#[derive(Debug)]
struct FakeProcessor {
    state: Mutex<Processor>,
    rng: Mutex<Rng>,
    /// Once the schedule is over, calls succeed and cancels answer.
    reliable: Mutex<bool>,
    /// A broken processor for the test that shows the checks would catch it: a cancel that
    /// finds no effect reports a tombstone without making one.
    cancel_tombstones: bool,
}

impl FakeProcessor {
    fn new(seed: u64, cancel_tombstones: bool) -> Self {
        Self {
            state: Mutex::default(),
            rng: Mutex::new(Rng(seed)),
            reliable: Mutex::new(false),
            cancel_tombstones,
        }
    }

    fn state(&self) -> MutexGuard<'_, Processor> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reliable(&self) -> bool {
        *self.reliable.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn roll(&self, percent: u64) -> bool {
        !self.reliable()
            && self
                .rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .chance(percent)
    }

    fn fate(&self) -> Fate {
        if self.reliable() {
            return Fate::Succeed;
        }
        match self.rng.lock().unwrap_or_else(|p| p.into_inner()).below(10) {
            0 => Fate::Decline,
            1 => Fate::LostOnTheWay,
            2 | 3 => Fate::LostOnTheWayBack,
            _ => Fate::Succeed,
        }
    }

    async fn pay(&self, key: &str, amount: u64) -> Result<Payment, EffectError> {
        // On its way to the processor: a cancel may come first.
        yield_once().await;
        let fate = self.arrive(key)?;
        let call = Call {
            processor: self,
            key,
            amount,
            fate,
            finished: false,
        };
        // The call is at the processor: its caller may be dropped here, and it still finishes.
        yield_once().await;
        call.finish()
    }

    /// A call under `key` reaches the processor: the answer under the key if it has one,
    /// else the fate of a new call, which is now processing.
    fn arrive(&self, key: &str) -> Result<Fate, EffectError> {
        let mut state = self.state();
        if state.tombstones.contains(key) {
            return Err(unavailable("the key is canceled"));
        }
        if let Some(payment) = state.effects.get(key) {
            return Ok(Fate::Replay(payment.clone()));
        }
        if state.declined.contains(key) {
            return Err(declined());
        }
        // As a real processor does with a key whose first request is still being processed.
        if state.processing.get(key).is_some_and(|&n| n > 0) {
            return Err(unavailable("a request with this key is being processed"));
        }
        let fate = self.fate();
        state
            .log
            .push(format!("a call under {key} arrives: {fate:?}"));
        if fate == Fate::LostOnTheWay {
            return Err(unavailable("connection refused"));
        }
        *state.processing.entry(key.to_owned()).or_default() += 1;
        Ok(fate)
    }

    async fn cancel(&self, key: &str) -> Result<Settled<Payment>, EffectError> {
        yield_once().await;
        if self.roll(10) {
            return Err(unavailable("connection refused"));
        }
        let mut state = self.state();
        if state.processing.get(key).is_some_and(|&n| n > 0) {
            return Ok(Settled::StillProcessing);
        }
        state.log.push(format!("cancel {key}"));
        if let Some(payment) = state.effects.get(key) {
            return Ok(Settled::Exists(payment.clone()));
        }
        if self.cancel_tombstones {
            state.tombstones.insert(key.to_owned());
        }
        Ok(Settled::Tombstoned)
    }
}

/// A call that reached the processor: finished on drop if its caller went away.
struct Call<'a> {
    processor: &'a FakeProcessor,
    key: &'a str,
    amount: u64,
    fate: Fate,
    finished: bool,
}

impl Call<'_> {
    fn finish(mut self) -> Result<Payment, EffectError> {
        self.finished = true;
        self.complete()
    }

    fn complete(&self) -> Result<Payment, EffectError> {
        if let Fate::Replay(payment) = &self.fate {
            return Ok(payment.clone());
        }
        let mut state = self.processor.state();
        if let Some(n) = state.processing.get_mut(self.key) {
            *n -= 1;
        }
        state
            .log
            .push(format!("the call under {} finishes", self.key));
        if self.fate == Fate::Decline {
            state.declined.insert(self.key.to_owned());
            return Err(declined());
        }
        let payment = match state.effects.get(self.key) {
            Some(payment) => payment.clone(),
            None => {
                let payment = Payment {
                    id: format!("py_{}", state.made.len() + 1),
                    amount: self.amount,
                };
                state.effects.insert(self.key.to_owned(), payment.clone());
                state.made.push(payment.clone());
                payment
            }
        };
        match self.fate {
            Fate::LostOnTheWayBack => Err(unavailable("timed out")),
            _ => Ok(payment),
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.complete();
        }
    }
}

fn unavailable(reason: &str) -> EffectError {
    EffectError::Unavailable {
        reason: reason.to_owned(),
    }
}

fn declined() -> EffectError {
    EffectError::Declined {
        code: "insufficient_funds".into(),
        message: "declined".into(),
    }
}

/// Where an injected failure strikes a call: before it does anything, or after it did
/// everything (a commit whose answer is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strike {
    Before,
    After,
}

/// Injects failures into a port's calls, from its own seed, until the schedule is over.
#[derive(Debug)]
struct Faults {
    rng: Mutex<Rng>,
    percent: u64,
    on: Mutex<bool>,
}

impl Faults {
    fn new(seed: u64, percent: u64) -> Self {
        Self {
            rng: Mutex::new(Rng(seed)),
            percent,
            on: Mutex::new(true),
        }
    }

    fn off(&self) {
        *self.on.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }

    fn strike(&self) -> Option<Strike> {
        if !*self.on.lock().unwrap_or_else(|p| p.into_inner()) {
            return None;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        if !rng.chance(self.percent) {
            return None;
        }
        Some(if rng.chance(50) {
            Strike::Before
        } else {
            Strike::After
        })
    }

    /// Runs `call` under an injected failure, if one strikes.
    async fn around<T, E>(
        &self,
        failure: impl FnOnce() -> E,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        match self.strike() {
            Some(Strike::Before) => Err(failure()),
            Some(Strike::After) => {
                call.await?;
                Err(failure())
            }
            None => call.await,
        }
    }
}

fn store_down() -> StoreFailure {
    StoreFailure::unavailable("injected: the store did not answer")
}

fn cache_down() -> CacheFailure {
    "injected: the cache did not answer".into()
}

/// The in-memory records with failures injected into every call.
#[derive(Debug)]
struct FlakyRecords {
    records: Arc<MemoryRecords>,
    faults: Faults,
}

#[async_trait]
impl RecordStore for FlakyRecords {
    type Transaction = MemoryTransaction;

    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreFailure> {
        let call = self.records.claim(scope, key, fingerprint, request_body);
        self.faults.around(store_down, call).await
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreFailure> {
        let call = self.records.find_record(scope, key);
        self.faults.around(store_down, call).await
    }

    async fn record_effect(&self, owner: Owner<'_>, id: &str) -> Result<Finish, StoreFailure> {
        let call = self.records.record_effect(owner, id);
        self.faults.around(store_down, call).await
    }

    async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreFailure> {
        self.faults
            .around(store_down, self.records.release(owner))
            .await
    }

    async fn begin(
        &self,
        owner: Owner<'_>,
        begin: Begin,
    ) -> Result<Option<MemoryTransaction>, StoreFailure> {
        let call = self.records.begin(owner, begin);
        self.faults.around(store_down, call).await
    }

    async fn end(
        &self,
        transaction: &mut MemoryTransaction,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, StoreFailure> {
        let call = self.records.end(transaction, owner, end);
        self.faults.around(store_down, call).await
    }

    async fn commit(&self, transaction: MemoryTransaction) -> Result<(), StoreFailure> {
        let call = self.records.commit(transaction);
        self.faults.around(store_down, call).await
    }

    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreFailure> {
        let call = self.records.take_over_abandoned(settle_after);
        self.faults.around(store_down, call).await
    }
}

#[async_trait]
impl RecordBatches for FlakyRecords {
    async fn begin_batch(&self) -> Result<MemoryTransaction, StoreFailure> {
        let call = self.records.begin_batch();
        self.faults.around(store_down, call).await
    }

    async fn complete_many(
        &self,
        transaction: &mut MemoryTransaction,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> Result<Vec<Completion>, StoreFailure> {
        let call = self.records.complete_many(transaction, records);
        self.faults.around(store_down, call).await
    }
}

/// The in-memory cache with failures injected into every call.
#[derive(Debug)]
struct FlakyCache {
    cache: MemoryCache,
    faults: Faults,
}

#[async_trait]
impl ResponseCache for FlakyCache {
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<CacheRead, CacheFailure> {
        self.faults
            .around(cache_down, self.cache.get(scope, key))
            .await
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
        let call = self
            .cache
            .put(scope, key, generation, fingerprint, response, expires_at);
        self.faults.around(cache_down, call).await
    }

    async fn forget(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), CacheFailure> {
        self.faults
            .around(cache_down, self.cache.forget(scope, key))
            .await
    }
}

/// A payment of an amount, in schema version `VERSION`, whose answers name their version: it
/// holds something for its generation when prepared (as a refund reserves its amount), and
/// its finish writes the effect's row with the record. `SCOPED_BY_VERSION` is the identity
/// before versions left it (`payments.create.v1`), for the test that shows the checks catch it.
#[derive(Debug)]
struct Pay<const VERSION: u32, const SCOPED_BY_VERSION: bool> {
    processor: Arc<FakeProcessor>,
}

#[async_trait]
impl<const VERSION: u32, const SCOPED_BY_VERSION: bool> Operation
    for Pay<VERSION, SCOPED_BY_VERSION>
{
    type Request = u64;
    type Plan = u64;
    type Effect = Payment;
    type Transaction = MemoryTransaction;

    const FAMILY: &'static str = match (SCOPED_BY_VERSION, VERSION) {
        (false, _) => "payments.create",
        (true, 1) => "payments.create.v1",
        (true, _) => "payments.create.v2",
    };
    const VERSION: SchemaVersion = SchemaVersion::new(VERSION);
    const EFFECT: &'static str = "pay";
    const ROUTE: (&'static str, &'static str) = ("POST", "/payments");

    fn canonical_request(amount: &u64) -> serde_json::Value {
        json!({ "amount": amount })
    }

    fn stored_request(&self, body: &[u8]) -> Option<u64> {
        let body: serde_json::Value = serde_json::from_slice(body).ok()?;
        body["amount"].as_u64()
    }

    /// Holds something for the generation, as a refund reserves its amount.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, MemoryTransaction>,
        _: Owner<'_>,
        amount: &u64,
    ) -> Result<Prepared<u64>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        transaction.hold();
        Ok(Prepared::Ready(*amount))
    }

    async fn effect(&self, amount: &u64, effect_key: &str) -> Result<Payment, EffectError> {
        self.processor.pay(effect_key, *amount).await
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<Payment>, EffectError> {
        self.processor.cancel(effect_key).await
    }

    fn effect_id(payment: &Payment) -> String {
        payment.id.clone()
    }

    fn confirms(payment: &Payment, amount: &u64) -> Result<(), String> {
        (payment.amount == *amount)
            .then_some(())
            .ok_or_else(|| format!("paid {} instead of {amount}", payment.amount))
    }

    fn declined(&self, code: String, _message: String) -> StoredResponse {
        let body = json!({ "code": code, "version": VERSION })
            .to_string()
            .into_bytes();
        let headers = [("content-type", "application/json")];
        StoredResponse::new(Self::VERSION, 402, headers, body)
    }

    /// The effect's row, in the transaction the engine completes the record in.
    async fn finish(
        &self,
        transaction: &mut MemoryTransaction,
        owner: Owner<'_>,
        amount: &u64,
        effect_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let (row, response) = self.rows(owner, amount, effect_id)?;
        self.write_rows(transaction, &[&row]).await?;
        Ok(response)
    }
}

/// On a store that writes batches, the finishes of concurrent attempts of one version share
/// a transaction.
#[async_trait]
impl<const VERSION: u32, const SCOPED_BY_VERSION: bool> FinishesInBatches
    for Pay<VERSION, SCOPED_BY_VERSION>
{
    type Rows = EffectRow;

    fn rows(
        &self,
        owner: Owner<'_>,
        _amount: &u64,
        effect_id: String,
    ) -> Result<(EffectRow, StoredResponse), ProtocolError> {
        let id = owner.fence.generation.to_string();
        let body = json!({ "id": id, "effect": effect_id, "version": VERSION });
        let response = StoredResponse::new(
            Self::VERSION,
            201,
            [("content-type", "application/json")],
            body.to_string().into_bytes(),
        );
        Ok((EffectRow::of(owner, effect_id), response))
    }

    async fn write_rows(
        &self,
        transaction: &mut MemoryTransaction,
        rows: &[&EffectRow],
    ) -> Result<(), ProtocolError> {
        for row in rows {
            transaction.insert_row((*row).clone());
        }
        Ok(())
    }
}

/// Counts the batches that held several finishes.
#[derive(Debug, Default)]
struct SeveralFinishes(AtomicUsize);

#[async_trait]
impl Observer for SeveralFinishes {
    fn finishes_written(&self, _: &'static str, finishes: usize) {
        if finishes > 1 {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

type Step<'a> = Pin<Box<dyn Future<Output = Option<Result<Answer, ProtocolError>>> + 'a>>;

/// Polls `future` to its end: every await in these ports is a yield.
fn run_to_end<T>(mut future: Pin<Box<dyn Future<Output = T> + '_>>) -> T {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
    }
}

/// How a schedule's store may be broken, for the tests that show the checks catch it.
#[derive(Debug, Clone, Copy, Default)]
struct Breakage {
    store_without_fence: bool,
    cancel_without_tombstone: bool,
    keys_scoped_by_version: bool,
}

/// One schedule from `seed`: how many batches of several finishes it wrote, or, as `Err`, the
/// guarantee it broke, with the steps taken.
fn schedule(seed: u64, breakage: Breakage) -> Result<usize, String> {
    if breakage.keys_scoped_by_version {
        schedule_of::<true>(seed, breakage)
    } else {
        schedule_of::<false>(seed, breakage)
    }
}

/// [`schedule`], with the operation's keys scoped by its version or not.
fn schedule_of<const SCOPED_BY_VERSION: bool>(
    seed: u64,
    breakage: Breakage,
) -> Result<usize, String> {
    let mut rng = Rng(seed);
    let start = Utc::now();
    let policy = IdempotencyPolicy {
        ttl: Duration::from_secs(24 * 60 * 60),
        lock_timeout: LOCK,
    };
    let mut records = MemoryRecords::new(policy, start);
    // Half the schedules fence the transactions that end records at their end, as the
    // PostgreSQL store does: the operation's rows are written before the fence is checked.
    if rng.next().is_multiple_of(2) {
        records = records.fencing_at_the_end();
    }
    // Half the schedules write the finishes of concurrent attempts in batches, as the
    // PostgreSQL store does (drawn apart from the schedule's own draws, which stay as they
    // were).
    let batches = Rng(seed ^ 0x0ba7_c4e5).chance(50);
    if breakage.store_without_fence {
        records = records.without_fence();
    }
    let records = Arc::new(records);
    let flaky = Arc::new(FlakyRecords {
        records: Arc::clone(&records),
        faults: Faults::new(rng.next(), 5),
    });
    let processor = Arc::new(FakeProcessor::new(
        rng.next(),
        !breakage.cancel_without_tombstone,
    ));
    // Two builds of a fleet mid-deploy: each instance's engine knows its own version.
    let pay_v1 = Arc::new(Idempotent::finishing_in_batches(Pay::<
        1,
        SCOPED_BY_VERSION,
    > {
        processor: Arc::clone(&processor),
    }));
    let pay_v2 = Arc::new(Idempotent::finishing_in_batches(Pay::<
        2,
        SCOPED_BY_VERSION,
    > {
        processor: Arc::clone(&processor),
    }));
    let several = Arc::new(SeveralFinishes::default());
    let over_the_store = || {
        let engine = Engine::new(Arc::clone(&flaky) as _);
        if batches {
            engine.with_batches(Arc::clone(&flaky) as _)
        } else {
            engine
        }
    };
    let mut engine_v1 = over_the_store()
        .with_operation(Arc::clone(&pay_v1))
        .with_observer(Arc::clone(&several) as _);
    let mut engine_v2 = over_the_store()
        .with_operation(Arc::clone(&pay_v2))
        .with_observer(Arc::clone(&several) as _);
    let cache = Arc::new(FlakyCache {
        cache: MemoryCache::default(),
        faults: Faults::new(rng.next(), 10),
    });
    if rng.chance(50) {
        engine_v1 = engine_v1.with_cache(Arc::clone(&cache) as _);
        engine_v2 = engine_v2.with_cache(Arc::clone(&cache) as _);
    }
    // Each instance's own recent answers, in front of the cache and the records.
    if rng.chance(50) {
        engine_v1 = engine_v1.with_recent_answers(RecentAnswers::new(1 << 20));
        engine_v2 = engine_v2.with_recent_answers(RecentAnswers::new(1 << 20));
    }
    let body = json!({ "amount": 500 });
    let key = IdempotencyKey::parse("order-1").map_err(|e| e.to_string())?;
    let attempt = || KeyedRequest {
        tenant: "acme".into(),
        key: key.clone(),
        fingerprint: fingerprint_of::<Pay<1, SCOPED_BY_VERSION>>(&500, &body),
        canonical_body: canonical_json(&body).into_bytes(),
        request: 500,
        wait: None,
        verbatim: None,
    };
    let client = |version: u32| -> Step<'_> {
        if version == 1 {
            Box::pin(async { Some(engine_v1.run(&pay_v1, attempt()).await) })
        } else {
            Box::pin(async { Some(engine_v2.run(&pay_v2, attempt()).await) })
        }
    };
    let completer = |version: u32| -> Step<'_> {
        let engine = if version == 1 { &engine_v1 } else { &engine_v2 };
        Box::pin(async move {
            if let Ok(Some(record)) = engine.take_over_abandoned(SETTLE_AFTER).await {
                let _ = engine.settle_abandoned(&record).await;
            }
            None
        })
    };
    let engines = [&engine_v1, &engine_v2];

    let mut trace = Vec::new();
    let mut answers = Vec::new();
    let mut live: Vec<(String, Step<'_>)> = Vec::new();
    let (mut clients, mut completers) = (0, 0);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..120 {
        match rng.below(100) {
            0..=9 if clients < 4 => {
                clients += 1;
                let version = 1 + rng.below(2) as u32;
                live.push((format!("client {clients} (v{version})"), client(version)));
                trace.push(format!("start client {clients} on v{version}"));
            }
            10..=15 if completers < 3 => {
                completers += 1;
                let version = 1 + rng.below(2) as u32;
                let name = format!("completer {completers} (v{version})");
                live.push((name, completer(version)));
                trace.push(format!("start completer {completers} on v{version}"));
            }
            16..=20 => {
                records.advance(LOCK + SETTLE_AFTER + Duration::from_secs(1));
                trace.push("clock past the lock and the settle grace".into());
            }
            21..=24 if !live.is_empty() => {
                let index = rng.below(live.len() as u64) as usize;
                let (name, _) = live.swap_remove(index);
                trace.push(format!("crash {name}"));
            }
            _ if !live.is_empty() => {
                let index = rng.below(live.len() as u64) as usize;
                if let Poll::Ready(answer) = live[index].1.as_mut().poll(&mut cx) {
                    let (name, _) = live.swap_remove(index);
                    trace.push(format!("{name} ended: {}", describe(&answer)));
                    answers.extend(answer);
                }
            }
            _ => {}
        }
    }
    // What is still live runs to its end, each polled in turn as concurrent processes run: one
    // may wait for a transaction another holds.
    while !live.is_empty() {
        for index in (0..live.len()).rev() {
            if let Poll::Ready(answer) = live[index].1.as_mut().poll(&mut cx) {
                let (name, _) = live.swap_remove(index);
                trace.push(format!("{name} ran to its end: {}", describe(&answer)));
                answers.extend(answer);
            }
        }
    }

    // At rest: the processor answers, the completer settles what is left, the client retries.
    *processor.reliable.lock().unwrap_or_else(|p| p.into_inner()) = true;
    flaky.faults.off();
    cache.faults.off();
    for round in 0..4 {
        records.advance(LOCK + SETTLE_AFTER + Duration::from_secs(1));
        let engine = engines[round % 2];
        settle_everything(engine)?;
    }
    for version in [1, 2] {
        let last = run_to_end(client(version));
        trace.push(format!("the last retry on v{version}: {}", describe(&last)));
        answers.extend(last);
    }

    let answers: Vec<_> = answers
        .into_iter()
        .map(|answer| (key.clone(), answer))
        .collect();
    at_rest(&records, &processor, &answers, &trace, &several)
}

/// The completer, run until it finds nothing left to take over.
fn settle_everything(engine: &Engine<MemoryTransaction>) -> Result<(), String> {
    while run_to_end(Box::pin(engine.take_over_abandoned(SETTLE_AFTER)))
        .map_err(|e| e.to_string())?
        .is_some_and(|record| {
            let _ = run_to_end(Box::pin(engine.settle_abandoned(&record)));
            true
        })
    {}
    Ok(())
}

/// The guarantees, checked at rest ([`check`]): a broken one with the schedule's steps and
/// the processor's log, else how many batches of several finishes the schedule wrote.
fn at_rest(
    records: &MemoryRecords,
    processor: &FakeProcessor,
    answers: &[(IdempotencyKey, Result<Answer, ProtocolError>)],
    trace: &[String],
    several: &SeveralFinishes,
) -> Result<usize, String> {
    check(records, processor, answers).map_err(|broken| {
        format!(
            "{broken}\n  steps:\n    {}\n  at the processor:\n    {}",
            trace.join("\n    "),
            processor.state().log.join("\n    ")
        )
    })?;
    Ok(several.0.load(Ordering::Relaxed))
}

fn describe(answer: &Option<Result<Answer, ProtocolError>>) -> String {
    match answer {
        None => "settled one record, or none".into(),
        Some(Ok(answer)) => format!(
            "{} {}{}, written by v{}",
            answer.response.status,
            String::from_utf8_lossy(&answer.response.body),
            if answer.replayed { " (replayed)" } else { "" },
            answer.written_by
        ),
        Some(Err(error)) => format!("error: {error}"),
    }
}

/// The guarantees, checked on the store at rest, for every record, with the answers each
/// key's clients received.
fn check(
    records: &MemoryRecords,
    processor: &FakeProcessor,
    answers: &[(IdempotencyKey, Result<Answer, ProtocolError>)],
) -> Result<(), String> {
    let state = processor.state();
    let rows = records.rows();
    for payment in &state.made {
        let recorded = rows
            .iter()
            .filter(|row| row.effect_id == payment.id)
            .count();
        if recorded != 1 {
            return Err(format!("effect {} has {recorded} rows", payment.id));
        }
    }
    if rows.len() != state.made.len() {
        return Err(format!(
            "{} rows for {} effects made",
            rows.len(),
            state.made.len()
        ));
    }
    let all = records.records();
    if all.is_empty() {
        return Err("no record at rest".into());
    }
    for record in &all {
        let of_the_key = rows.iter().filter(|row| row.key == record.key).count();
        if of_the_key > 1 {
            return Err(format!(
                "more than one effect made under {}: {:?}",
                record.key.as_str(),
                state.made
            ));
        }
        if record.state != RecordState::Completed {
            return Err(format!(
                "the record of {} is {:?} at rest",
                record.key.as_str(),
                record.state
            ));
        }
        let stored = record
            .response
            .as_ref()
            .ok_or("a completed record without its response")?;
        if stored.status == 201 && !rows.iter().any(|row| row.generation == record.generation) {
            return Err("the completed record has no row of its effect".into());
        }
        let received = answers
            .iter()
            .filter(|(key, _)| *key == record.key)
            .filter_map(|(_, answer)| answer.as_ref().ok());
        for answer in received {
            if answer.response != *stored || answer.written_by != stored.schema_version {
                return Err(format!(
                    "a client received {} {}, the record holds {} {}",
                    answer.response.status,
                    String::from_utf8_lossy(&answer.response.body),
                    stored.status,
                    String::from_utf8_lossy(&stored.body)
                ));
            }
        }
    }
    for key in records.failed_keys() {
        if !state.tombstones.contains(&key) {
            return Err(format!(
                "a record was failed but its effect key {key} is not tombstoned"
            ));
        }
    }
    if !records.holds().is_empty() {
        return Err(format!(
            "holds outlive their records: {:?}",
            records.holds()
        ));
    }
    Ok(())
}

/// How many keys the schedules of several keys send requests under.
const KEYS: usize = 4;

/// One schedule of requests under several keys at once, from `seed`, on one engine over a
/// store that writes the finishes of concurrent attempts in batches: clients of any key
/// started, polled, crashed and left waiting in any order, the clock moved past their locks,
/// the processor and the store failing as in [`schedule`]. Brought to rest as a schedule is,
/// then every key retried once more, and checked as a schedule is, key by key. How many
/// batches of several finishes it wrote, or, as `Err`, the guarantee it broke.
fn schedule_of_several_keys(seed: u64) -> Result<usize, String> {
    let mut rng = Rng(seed);
    let policy = IdempotencyPolicy {
        ttl: Duration::from_secs(24 * 60 * 60),
        lock_timeout: LOCK,
    };
    let mut records = MemoryRecords::new(policy, Utc::now());
    if rng.next().is_multiple_of(2) {
        records = records.fencing_at_the_end();
    }
    let records = Arc::new(records);
    let flaky = Arc::new(FlakyRecords {
        records: Arc::clone(&records),
        faults: Faults::new(rng.next(), 5),
    });
    let processor = Arc::new(FakeProcessor::new(rng.next(), true));
    let pay = Arc::new(Idempotent::finishing_in_batches(Pay::<1, false> {
        processor: Arc::clone(&processor),
    }));
    let several = Arc::new(SeveralFinishes::default());
    let engine = Engine::new(Arc::clone(&flaky) as _)
        .with_batches(Arc::clone(&flaky) as _)
        .with_operation(Arc::clone(&pay))
        .with_observer(Arc::clone(&several) as _);
    let body = json!({ "amount": 500 });
    let keys = (1..=KEYS)
        .map(|n| IdempotencyKey::parse(&format!("order-{n}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let client = |key: &IdempotencyKey| -> Step<'_> {
        let request = KeyedRequest {
            tenant: "acme".into(),
            key: key.clone(),
            fingerprint: fingerprint_of::<Pay<1, false>>(&500, &body),
            canonical_body: canonical_json(&body).into_bytes(),
            request: 500,
            wait: None,
            verbatim: None,
        };
        let (engine, pay) = (&engine, &pay);
        Box::pin(async move { Some(engine.run(pay, request).await) })
    };
    let completer = || -> Step<'_> {
        let engine = &engine;
        Box::pin(async move {
            if let Ok(Some(record)) = engine.take_over_abandoned(SETTLE_AFTER).await {
                let _ = engine.settle_abandoned(&record).await;
            }
            None
        })
    };

    let mut trace = Vec::new();
    let mut answers = Vec::new();
    let mut live: Vec<(String, Option<IdempotencyKey>, Step<'_>)> = Vec::new();
    let (mut clients, mut completers) = (0, 0);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..200 {
        match rng.below(100) {
            0..=14 if clients < 3 * KEYS => {
                clients += 1;
                let key = &keys[rng.below(KEYS as u64) as usize];
                let name = format!("client {clients} of {}", key.as_str());
                trace.push(format!("start {name}"));
                live.push((name, Some(key.clone()), client(key)));
            }
            15..=17 if completers < 2 => {
                completers += 1;
                trace.push(format!("start completer {completers}"));
                live.push((format!("completer {completers}"), None, completer()));
            }
            18..=20 => {
                records.advance(LOCK + SETTLE_AFTER + Duration::from_secs(1));
                trace.push("clock past the lock and the settle grace".into());
            }
            21..=23 if !live.is_empty() => {
                let index = rng.below(live.len() as u64) as usize;
                let (name, _, _) = live.swap_remove(index);
                trace.push(format!("crash {name}"));
            }
            _ if !live.is_empty() => {
                let index = rng.below(live.len() as u64) as usize;
                if let Poll::Ready(answer) = live[index].2.as_mut().poll(&mut cx) {
                    let (name, key, _) = live.swap_remove(index);
                    trace.push(format!("{name} ended: {}", describe(&answer)));
                    answers.extend(key.zip(answer));
                }
            }
            _ => {}
        }
    }
    while !live.is_empty() {
        for index in (0..live.len()).rev() {
            if let Poll::Ready(answer) = live[index].2.as_mut().poll(&mut cx) {
                let (name, key, _) = live.swap_remove(index);
                trace.push(format!("{name} ran to its end: {}", describe(&answer)));
                answers.extend(key.zip(answer));
            }
        }
    }

    *processor.reliable.lock().unwrap_or_else(|p| p.into_inner()) = true;
    flaky.faults.off();
    for _ in 0..2 {
        records.advance(LOCK + SETTLE_AFTER + Duration::from_secs(1));
        settle_everything(&engine)?;
    }
    for key in &keys {
        let last = run_to_end(client(key));
        trace.push(format!(
            "the last retry of {}: {}",
            key.as_str(),
            describe(&last)
        ));
        answers.extend(last.map(|answer| (key.clone(), answer)));
    }

    at_rest(&records, &processor, &answers, &trace, &several)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `schedules` schedules derived from `seed`: how many batches of several finishes they
/// wrote, or the first broken one.
fn explore(seed: u64, schedules: u64, breakage: Breakage) -> Result<usize, (u64, String)> {
    let mut seeds = Rng(seed);
    let mut batches = 0;
    for _ in 0..schedules {
        let schedule_seed = seeds.next();
        batches += schedule(schedule_seed, breakage).map_err(|broken| (schedule_seed, broken))?;
    }
    Ok(batches)
}

#[test]
fn every_schedule_of_attempts_crashes_and_the_completer_keeps_every_guarantee() {
    let seed = env_u64("ENGINE_SEED", DEFAULT_SEED);
    let schedules = env_u64("ENGINE_SCHEDULES", DEFAULT_SCHEDULES);
    let batches =
        explore(seed, schedules, Breakage::default()).unwrap_or_else(|(schedule_seed, broken)| {
            panic!(
                "ENGINE_SEED={seed}: the schedule of seed {schedule_seed} broke a guarantee: \
                 {broken}"
            )
        });
    println!(
        "explored {schedules} schedules from ENGINE_SEED={seed}, with {batches} batches of \
         several finishes"
    );
}

/// Requests under several keys at once, whose finishes meet in batches: every guarantee
/// holds for every key, whatever crashes and failures strike a batch, its writer or the
/// requests waiting for it.
#[test]
fn every_schedule_of_several_keys_finishing_in_batches_keeps_every_guarantee() {
    let seed = env_u64("ENGINE_SEED", DEFAULT_SEED);
    let schedules = env_u64("ENGINE_SCHEDULES", DEFAULT_SCHEDULES) / 4;
    let mut seeds = Rng(seed ^ 0x05e7_e4a1);
    let mut batches = 0;
    for _ in 0..schedules {
        let schedule_seed = seeds.next();
        batches += schedule_of_several_keys(schedule_seed).unwrap_or_else(|broken| {
            panic!(
                "ENGINE_SEED={seed}: the schedule of several keys of seed {schedule_seed} broke \
                 a guarantee: {broken}"
            )
        });
    }
    assert!(
        batches > 0 || schedules < 1_000,
        "no batch of several finishes in {schedules} schedules"
    );
    println!(
        "explored {schedules} schedules of {KEYS} keys from ENGINE_SEED={seed}, with {batches} \
         batches of several finishes"
    );
}

/// Runs the default number of schedules with `breakage`, and prints the first it catches.
fn assert_caught(breakage: Breakage) {
    let seed = env_u64("ENGINE_SEED", DEFAULT_SEED);
    let caught = explore(seed, DEFAULT_SCHEDULES, breakage).err();
    let (schedule_seed, broken) =
        caught.unwrap_or_else(|| panic!("{breakage:?} broke no guarantee in any schedule"));
    println!("ENGINE_SEED={seed}: {breakage:?} caught at schedule seed {schedule_seed}: {broken}");
}

/// The checks are worth something only if they catch a broken store: without the fence, an
/// attempt that was taken over still writes, and some schedule records an effect twice.
#[test]
fn the_checks_catch_a_store_that_ignores_the_fence() {
    assert_caught(Breakage {
        store_without_fence: true,
        ..Breakage::default()
    });
}

/// Nor are they if they miss a settle that reads "no effect found" as "no effect": a call
/// still on its way then makes an effect after its record was failed.
#[test]
fn the_checks_catch_a_settle_that_fails_a_record_without_a_tombstone() {
    assert_caught(Breakage {
        cancel_without_tombstone: true,
        ..Breakage::default()
    });
}

/// Nor are they if the operation's keys were scoped by its schema version, as they once were:
/// a retry answered by the other build of the fleet is then a new record, and its effect a
/// second one.
#[test]
fn the_checks_catch_keys_scoped_by_the_schema_version() {
    assert_caught(Breakage {
        keys_scoped_by_version: true,
        ..Breakage::default()
    });
}

/// Operations are found by family through the engine's one registry: a registered family
/// gives its scope, whatever the version, any other none, so a caller never compares
/// operation names itself.
#[test]
fn the_registry_finds_an_operation_by_its_family_and_by_no_other() {
    let records = Arc::new(FlakyRecords {
        records: Arc::new(MemoryRecords::new(
            IdempotencyPolicy {
                ttl: Duration::from_secs(60),
                lock_timeout: LOCK,
            },
            Utc::now(),
        )),
        faults: Faults::new(1, 0),
    });
    let pay = Arc::new(Idempotent::new(Pay::<1, false> {
        processor: Arc::new(FakeProcessor::new(1, true)),
    }));
    let engine = Engine::new(records as _).with_operation(pay);

    assert_eq!(engine.operation_names(), [Pay::<1, false>::FAMILY]);
    let scope = engine.scope_named(Pay::<1, false>::FAMILY, "acme");
    assert_eq!(scope, Some(scope_of::<Pay<1, false>>("acme")));
    assert_eq!(scope, Some(scope_of::<Pay<2, false>>("acme")));
    assert_eq!(engine.scope_named("refunds.create", "acme"), None);
}
