//! The engine's guarantees over the SQL record store, on PostgreSQL and on SQLite: fewer
//! schedules than the engine's own (`crates/idempotency/tests/engine_schedules.rs`, over the
//! in-memory store), but real transactions, real row locks and the database's clock.
//!
//! Each schedule runs one request under one key: a few client attempts at once, each crashed
//! (its future dropped) after a random few milliseconds or let run, against an effect port that
//! makes the effect, declines it, loses the call on the way or loses the answer on the way
//! back; then the clock moves past the locks and the completer settles what was abandoned;
//! then the store is brought to rest (the completer, then a client that retries until it gets
//! a final answer). The operation holds a row while it works (a reservation, written in the
//! transaction the engine begins over the record) and writes one row per effect in the
//! record's transaction. After each schedule:
//! - at most one effect is made for the request, whatever its generations;
//! - every effect made has exactly one row, and every row is an effect made;
//! - every final answer a client received is the stored response, byte for byte;
//! - every effect key but the last generation's is tombstoned, with nothing made under it;
//! - no reservation outlives its record's end.
//!
//! `SQL_ENGINE_SEED` replays a run's choices (the interleavings are the database's).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use payments_idempotency::engine::conformance::Subject;
use payments_idempotency::engine::{
    Answer, EffectError, Engine, Idempotent, KeyedRequest, Operation, Owner, Prepared, Preparing,
    ProtocolError, RecordStore, Settled, Unmade,
};
use payments_idempotency::{IdempotencyKey, SchemaVersion, StoredResponse};
use payments_idempotency_sql::{Backend, SqlRecords, Transaction};
use serde_json::{Value, json};

const SCHEDULES: u64 = 64;
const SETTLE_AFTER: Duration = Duration::from_secs(5);

/// The operation's own tables, the same SQL on both backends.
const TABLES: [&str; 2] = [
    "CREATE TABLE holds (generation text PRIMARY KEY, tenant text NOT NULL)",
    "CREATE TABLE effects (effect_id text PRIMARY KEY, effect_key text NOT NULL UNIQUE,
                           tenant text NOT NULL)",
];

/// SplitMix64.
#[derive(Debug)]
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
}

/// What the effect port does with a new call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Make,
    Decline,
    /// Never reaches the port: nothing is made.
    LostOnTheWay,
    /// Made, and the answer lost.
    LostOnTheWayBack,
}

/// What the port holds under a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Held {
    Made(String),
    Tombstoned,
}

/// An effect port that, like a card processor, makes at most one effect per key, and
/// tombstones a key it is asked about and never used.
#[derive(Debug, Default)]
struct Port {
    keys: Mutex<HashMap<String, Held>>,
    fates: Mutex<Vec<Fate>>,
    /// How long each call takes, in milliseconds: an attempt can still be calling when the
    /// completer takes its record over.
    latencies: Mutex<Vec<u64>>,
    made: Mutex<u64>,
}

impl Port {
    fn keys(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_fate(&self) -> Fate {
        let mut fates = self.fates.lock().unwrap_or_else(|p| p.into_inner());
        fates.pop().unwrap_or(Fate::Make)
    }

    async fn call(&self, effect_key: &str) -> Result<String, EffectError> {
        let latency = {
            let mut latencies = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
            latencies.pop().unwrap_or(0)
        };
        tokio::time::sleep(Duration::from_millis(latency)).await;
        let unavailable = |reason: &str| EffectError::Unavailable {
            reason: reason.to_owned(),
        };
        let fate = self.next_fate();
        if fate == Fate::LostOnTheWay {
            return Err(unavailable("lost on the way"));
        }
        let mut keys = self.keys();
        let id = match keys.get(effect_key) {
            Some(Held::Made(id)) => id.clone(),
            Some(Held::Tombstoned) => {
                return Err(EffectError::Declined {
                    code: "key_tombstoned".to_owned(),
                    message: "the key is tombstoned".to_owned(),
                });
            }
            None if fate == Fate::Decline => {
                return Err(EffectError::Declined {
                    code: "declined".to_owned(),
                    message: "declined".to_owned(),
                });
            }
            None => {
                let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
                *made += 1;
                let id = format!("eff_{}", uuid::Uuid::new_v4().simple());
                keys.insert(effect_key.to_owned(), Held::Made(id.clone()));
                id
            }
        };
        if fate == Fate::LostOnTheWayBack {
            return Err(unavailable("lost on the way back"));
        }
        Ok(id)
    }

    fn settle(&self, effect_key: &str) -> Settled<String> {
        let mut keys = self.keys();
        match keys
            .entry(effect_key.to_owned())
            .or_insert(Held::Tombstoned)
        {
            Held::Made(id) => Settled::Exists(id.clone()),
            Held::Tombstoned => Settled::Tombstoned,
        }
    }
}

/// One request under one key, whose effect is a call to [`Port`], and which holds a row from
/// its preparation to its end.
#[derive(Debug)]
struct Hold {
    port: Arc<Port>,
}

fn json_response(status: u16, body: &Value) -> StoredResponse {
    let json = [("content-type", "application/json")];
    StoredResponse::new(
        SchemaVersion::new(1),
        status,
        json,
        body.to_string().into_bytes(),
    )
}

fn internal(error: impl std::error::Error + Send + Sync + 'static) -> ProtocolError {
    ProtocolError::Internal(error.into())
}

#[async_trait]
impl Operation for Hold {
    type Request = String;
    type Plan = String;
    type Effect = String;
    type Transaction = Transaction;

    const FAMILY: &'static str = "holds.create";
    const VERSION: SchemaVersion = SchemaVersion::new(1);
    const EFFECT: &'static str = "hold";
    const ROUTE: (&'static str, &'static str) = ("POST", "/holds");

    fn canonical_request(tenant: &String) -> Value {
        json!({ "tenant": tenant })
    }

    fn stored_request(&self, body: &[u8]) -> Option<String> {
        let body: Value = serde_json::from_slice(body).ok()?;
        Some(body["tenant"].as_str()?.to_owned())
    }

    /// The generation's hold, once: an attempt that resumes finds it there.
    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, Transaction>,
        owner: Owner<'_>,
        tenant: &String,
    ) -> Result<Prepared<String>, ProtocolError> {
        let Some(transaction) = preparing.transaction().await? else {
            return Ok(Prepared::Fenced);
        };
        let generation = owner.fence.generation.to_string();
        let sql = "INSERT INTO holds (generation, tenant) VALUES ($1, $2)
                   ON CONFLICT (generation) DO NOTHING";
        let hold = sqlx::query(sql).bind(&generation).bind(tenant);
        transaction.execute(hold).await.map_err(internal)?;
        Ok(Prepared::Ready(tenant.clone()))
    }

    async fn effect(&self, _: &String, effect_key: &str) -> Result<String, EffectError> {
        self.port.call(effect_key).await
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<String>, EffectError> {
        Ok(self.port.settle(effect_key))
    }

    fn effect_id(id: &String) -> String {
        id.clone()
    }

    fn declined(&self, code: String, _: String) -> StoredResponse {
        json_response(402, &json!({ "declined": code }))
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        tenant: &String,
        effect_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let generation = owner.fence.generation.to_string();
        let sql = "INSERT INTO effects (effect_id, effect_key, tenant) \
                   SELECT $1, processor_key, $2 FROM idempotency_records \
                   WHERE tenant_id = $3 AND operation = $4 AND idempotency_key = $5";
        let (scope, key) = (owner.scope, owner.key.as_str());
        let insert = sqlx::query(sql)
            .bind(&effect_id)
            .bind(tenant)
            .bind(&scope.tenant);
        let insert = insert.bind(&scope.operation).bind(key);
        transaction.execute(insert).await.map_err(internal)?;
        let release = "DELETE FROM holds WHERE generation = $1";
        let release = sqlx::query(release).bind(&generation);
        transaction.execute(release).await.map_err(internal)?;
        Ok(json_response(201, &json!({ "effect_id": effect_id })))
    }

    async fn end_unmade(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        _: Unmade<'_>,
    ) -> Result<(), ProtocolError> {
        let generation = owner.fence.generation.to_string();
        let release = "DELETE FROM holds WHERE generation = $1";
        let release = sqlx::query(release).bind(&generation);
        transaction.execute(release).await.map_err(internal)?;
        Ok(())
    }
}

/// A count on the store's own pool.
async fn count(records: &SqlRecords, sql: &str, tenant: &str) -> i64 {
    let counted = match records {
        SqlRecords::Postgres(r) => sqlx::query_as(sql).bind(tenant).fetch_one(r.pool()).await,
        SqlRecords::Sqlite(r) => sqlx::query_as(sql).bind(tenant).fetch_one(r.pool()).await,
    };
    let (n,): (i64,) = counted.unwrap_or_else(|e| panic!("{sql}: {e}"));
    n
}

/// The whole run on `backend`: its tables, then every schedule, each under a tenant of its own.
async fn explore(backend: Backend) {
    let fresh = common::on(backend).await;
    let records = fresh.records.clone();
    let mut write = records
        .begin_write()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for table in TABLES {
        let created = write.execute(sqlx::query(table)).await;
        created.unwrap_or_else(|e| panic!("{table}: {e}"));
    }
    write.commit().await.unwrap_or_else(|e| panic!("{e}"));
    let seed = std::env::var("SQL_ENGINE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_5017);
    let mut rng = Rng(seed);
    let mut seen = Seen::default();
    for schedule in 0..SCHEDULES {
        let tenant = format!("t{schedule}");
        match run_schedule(&fresh, &mut rng, &tenant).await {
            Ok(one) => seen.add(&one),
            Err(broken) => panic!("schedule {schedule} of seed {seed:#x} on {backend:?}: {broken}"),
        }
    }
    eprintln!("{backend:?}: {seen:?}");
    // The schedules reach what they are for: crashes, takeovers by the completer, failed
    // generations, declines and effects.
    assert!(
        seen.crashed > 0 && seen.settled > 0 && seen.tombstoned > 0,
        "{seen:?}"
    );
    assert!(seen.declined > 0 && seen.made > 0, "{seen:?}");
}

/// What the schedules of a run went through, summed.
#[derive(Debug, Default)]
struct Seen {
    crashed: u64,
    settled: u64,
    tombstoned: u64,
    declined: u64,
    made: u64,
}

impl Seen {
    fn add(&mut self, one: &Seen) {
        self.crashed += one.crashed;
        self.settled += one.settled;
        self.tombstoned += one.tombstoned;
        self.declined += one.declined;
        self.made += one.made;
    }
}

/// Moves the clock past every lock and the settle grace, and lets the completer settle what is
/// pending; returns how many records it settled.
async fn past_the_locks(
    fresh: &common::Fresh,
    engine: &Engine<Transaction>,
) -> Result<u64, String> {
    let lock = fresh.records.policy().lock_timeout;
    fresh
        .advance(lock + SETTLE_AFTER + Duration::from_secs(1))
        .await;
    let mut settled = 0;
    let failed = |e: ProtocolError| e.to_string();
    while let Some(abandoned) = engine
        .take_over_abandoned(SETTLE_AFTER)
        .await
        .map_err(failed)?
    {
        engine.settle_abandoned(&abandoned).await.map_err(failed)?;
        settled += 1;
    }
    Ok(settled)
}

/// One schedule; `Err` says which guarantee it broke.
async fn run_schedule(fresh: &common::Fresh, rng: &mut Rng, tenant: &str) -> Result<Seen, String> {
    let mut seen = Seen::default();
    let records = &fresh.records;
    let port = Arc::new(Port::default());
    {
        let fates = [
            Fate::Make,
            Fate::Decline,
            Fate::LostOnTheWay,
            Fate::LostOnTheWayBack,
        ];
        let mut queued = port.fates.lock().unwrap_or_else(|p| p.into_inner());
        // Popped from the end; past them every call makes the effect.
        *queued = (0..rng.below(4))
            .map(|_| fates[rng.below(4) as usize])
            .collect();
        let mut latencies = port.latencies.lock().unwrap_or_else(|p| p.into_inner());
        *latencies = (0..6).map(|_| rng.below(3) * rng.below(8)).collect();
    }
    let hold = Arc::new(Idempotent::new(Hold {
        port: Arc::clone(&port),
    }));
    let engine = Arc::new(
        Engine::new(Arc::new(records.clone()) as Arc<dyn RecordStore<Transaction = Transaction>>)
            .with_operation(Arc::clone(&hold)),
    );
    let key = IdempotencyKey::parse("the-request").map_err(|e| e.to_string())?;
    let request =
        || KeyedRequest::of::<Hold>(tenant.to_owned(), key.clone(), tenant.to_owned(), None);
    let answers = Arc::new(Mutex::new(Vec::<Answer>::new()));
    let keep = |answer: Result<Answer, ProtocolError>| {
        if let Ok(answer) = answer {
            answers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(answer);
        }
    };

    // Client attempts at once, each crashed after a few milliseconds or let run.
    let mut attempts = tokio::task::JoinSet::new();
    for _ in 0..=rng.below(3) {
        let (engine, hold, request) = (Arc::clone(&engine), Arc::clone(&hold), request());
        let crash_after = match rng.below(3) {
            0 => None,
            _ => Some(Duration::from_millis(rng.below(12))),
        };
        attempts.spawn(async move {
            let run = engine.run(&hold, request);
            match crash_after {
                None => Some(run.await),
                Some(after) => tokio::time::timeout(after, run).await.ok(),
            }
        });
    }
    // Meanwhile, once or not at all, the clock jumps past the locks, the completer takes over
    // whatever is pending and a retry comes in, while attempts may still be at work.
    let lock = records.policy().lock_timeout;
    let jump = rng.below(2) == 0;
    let jump_after = Duration::from_millis(rng.below(10));
    let interloper = {
        let (engine, hold, retry) = (Arc::clone(&engine), Arc::clone(&hold), request());
        async move {
            if !jump {
                return Ok::<_, String>((0, None));
            }
            tokio::time::sleep(jump_after).await;
            let settled = past_the_locks(fresh, &engine).await?;
            Ok((settled, Some(engine.run(&hold, retry).await)))
        }
    };
    let collect = async {
        while let Some(done) = attempts.join_next().await {
            match done.map_err(|e| e.to_string())? {
                Some(answer) => keep(answer),
                None => seen.crashed += 1,
            }
        }
        Ok::<_, String>(())
    };
    let (collected, interloped) = tokio::join!(collect, interloper);
    collected?;
    let (settled, retried) = interloped?;
    seen.settled += settled;
    if let Some(answer) = retried {
        keep(answer);
    }

    // The clock moves past the locks and the settle grace: the completer settles the rest.
    seen.settled += past_the_locks(fresh, &engine).await?;

    // At rest: a client retries until it has a final answer.
    let mut last = None;
    for _ in 0..6 {
        match engine.run(&hold, request()).await {
            Ok(answer) => {
                last = Some(answer.response.status);
                keep(Ok(answer));
                break;
            }
            Err(_) => {
                fresh
                    .advance(lock + SETTLE_AFTER + Duration::from_secs(1))
                    .await
            }
        }
    }
    let last = last.ok_or("no final answer at rest")?;

    // The guarantees.
    let made = *port.made.lock().unwrap_or_else(|p| p.into_inner());
    if made > 1 {
        return Err(format!("{made} effects made for one request"));
    }
    let rows = count(
        records,
        "SELECT count(*) FROM effects WHERE tenant = $1",
        tenant,
    )
    .await;
    if rows != i64::try_from(made).unwrap_or(i64::MAX) {
        return Err(format!("{made} effects made, {rows} rows"));
    }
    let (stored, _) = records
        .find_record(
            &payments_idempotency::engine::scope_of::<Hold>(tenant),
            &key,
        )
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no record at rest")?;
    let stored_response = stored
        .response
        .clone()
        .ok_or("the record at rest is not completed")?;
    for answer in answers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        if answer.response != stored_response {
            return Err(format!(
                "an answer {:?} is not the stored one",
                answer.response
            ));
        }
    }
    if last == 201 && made != 1 {
        return Err("a 201 without its effect".to_owned());
    }
    for (effect_key, held) in port.keys().iter() {
        if effect_key != &stored.effect_key && held != &Held::Tombstoned {
            return Err(format!("{effect_key} of an earlier generation is {held:?}"));
        }
    }
    let holds = count(
        records,
        "SELECT count(*) FROM holds WHERE tenant = $1",
        tenant,
    )
    .await;
    if holds != 0 {
        return Err(format!("{holds} holds outlive their record"));
    }
    let tombstoned = port
        .keys()
        .values()
        .filter(|held| **held == Held::Tombstoned)
        .count();
    seen.tombstoned = u64::try_from(tombstoned).unwrap_or(u64::MAX);
    seen.declined = u64::from(last == 402);
    seen.made = made;
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_engines_guarantees_under_crashes_and_the_completer() {
    explore(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_the_engines_guarantees_under_crashes_and_the_completer() {
    explore(Backend::Sqlite).await;
}
