//! The storage protocol against real databases: claims, takeovers, fencing, expiry and the
//! pruning of published events.
//! Every test runs once per backend (PostgreSQL and SQLite), each time on its own database.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use payments_domain::{
    Amount, Charge, ChargeId, Currency, EventId, Money, PaymentSource, RefundRequest, TenantId,
};
use payments_idempotency::engine::{
    Begin, Claim, Claimed, Completion, End, Fence, Finish, Owner, RecordStore, Unmade,
};
use payments_idempotency::{
    Attempt, Fingerprint, IdempotencyKey, IdempotencyPolicy, RecoveryPoint, SchemaVersion, Scope,
    StoredResponse,
};
use payments_idempotency_sql::SqlRecords;
use payments_storage::{
    Backend, Database, EventPruning, ListEvents, PoolSettings, RefundRefusal, RefundRepository,
    Reservation, Store, StoreError, Transaction,
};
use serde_json::json;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Connection, PgConnection};

/// A failure of the store or of its records, as the engine's writes would see it.
type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The operation names the service's charges and refunds are stored under.
const CHARGES_CREATE: &str = "charges.create";
const REFUNDS_CREATE: &str = "refunds.create";

/// Runs each named test once per backend: `postgres::<name>` and `sqlite::<name>`.
macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(payments_storage::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(payments_storage::Backend::Sqlite).await;
                }
            )*
        }
    };
}

/// The writes of an owning attempt as the engine makes them: each in a transaction begun over
/// the record, with the record's end in the same transaction, committed only if the end took.
/// A record another attempt owns gives no transaction: [`Completion::Fenced`], or `None`.
trait AsTheEngineWrites {
    async fn finish_charge(
        &self,
        owner: Owner<'_>,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Completion, Failure>;

    async fn complete_without_effect(
        &self,
        owner: Owner<'_>,
        response: &StoredResponse,
    ) -> Result<Completion, Failure>;

    async fn fail(&self, owner: Owner<'_>) -> Result<Completion, Failure>;

    async fn reserve_refund(
        &self,
        owner: Owner<'_>,
        request: &RefundRequest,
        created_at: chrono::DateTime<Utc>,
    ) -> Result<Option<Reservation>, Failure>;

    async fn finish_refund(
        &self,
        owner: Owner<'_>,
        refund: &payments_domain::Refund,
        response: &StoredResponse,
    ) -> Result<Completion, Failure>;

    async fn end_refund(&self, owner: Owner<'_>, end: Unmade<'_>) -> Result<Completion, Failure>;
}

impl AsTheEngineWrites for Arc<dyn Store> {
    async fn finish_charge(
        &self,
        owner: Owner<'_>,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Completion, Failure> {
        let write =
            async |transaction: &mut Transaction| self.insert_charge(transaction, charge).await;
        end_in_transaction(self.as_ref(), owner, End::Made(response), write).await
    }

    async fn complete_without_effect(
        &self,
        owner: Owner<'_>,
        response: &StoredResponse,
    ) -> Result<Completion, Failure> {
        let end = End::Unmade(Unmade::Answered(response));
        end_in_transaction(self.as_ref(), owner, end, async |_| Ok(())).await
    }

    async fn fail(&self, owner: Owner<'_>) -> Result<Completion, Failure> {
        let end = End::Unmade(Unmade::Tombstoned);
        end_in_transaction(self.as_ref(), owner, end, async |_| Ok(())).await
    }

    async fn reserve_refund(
        &self,
        owner: Owner<'_>,
        request: &RefundRequest,
        created_at: chrono::DateTime<Utc>,
    ) -> Result<Option<Reservation>, Failure> {
        let Some(mut transaction) = self.records().begin(owner, Begin::HOLDING).await? else {
            return Ok(None);
        };
        let reservation = RefundRepository::reserve_refund(
            self.as_ref(),
            &mut transaction,
            owner,
            request,
            created_at,
        )
        .await?;
        self.records().commit(transaction).await?;
        Ok(Some(reservation))
    }

    async fn finish_refund(
        &self,
        owner: Owner<'_>,
        refund: &payments_domain::Refund,
        response: &StoredResponse,
    ) -> Result<Completion, Failure> {
        let write = async |transaction: &mut Transaction| {
            RefundRepository::finish_refunds(self.as_ref(), transaction, &[refund]).await
        };
        end_in_transaction(self.as_ref(), owner, End::Made(response), write).await
    }

    async fn end_refund(&self, owner: Owner<'_>, end: Unmade<'_>) -> Result<Completion, Failure> {
        let release =
            async |transaction: &mut Transaction| self.release_refund(transaction, owner).await;
        end_in_transaction(self.as_ref(), owner, End::Unmade(end), release).await
    }
}

/// `write`, then the record's `end`, in one transaction begun to end the record, as the
/// engine begins it (`Begin::ENDING`).
async fn end_in_transaction(
    store: &dyn Store,
    owner: Owner<'_>,
    end: End<'_>,
    write: impl AsyncFnOnce(&mut Transaction) -> Result<(), StoreError>,
) -> Result<Completion, Failure> {
    let records = store.records();
    let Some(mut transaction) = records.begin(owner, Begin::ENDING).await? else {
        return Ok(Completion::Fenced);
    };
    write(&mut transaction).await?;
    let completion = records.end(&mut transaction, owner, end).await?;
    if completion != Completion::Fenced {
        records.commit(transaction).await?;
    }
    Ok(completion)
}

/// A store on a fresh database, and a plain connection pool to the same database for the
/// test's own reads and time travel. Dropping it removes the database.
struct TestDb {
    store: Arc<dyn Store>,
    /// The store's idempotency records, as the engine works on them.
    records: SqlRecords,
    raw: AnyPool,
    backend: Backend,
    /// Dropped last, it removes the database.
    _cleanup: Cleanup,
}

enum Cleanup {
    DropDatabase(String),
    RemoveDirectory(PathBuf),
}

fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn test_db(backend: Backend) -> TestDb {
    test_db_created(backend, "").await
}

/// A store as [`test_db`] makes one, its PostgreSQL database created with `options`
/// (`CREATE DATABASE name options`).
async fn test_db_created(backend: Backend, options: &str) -> TestDb {
    sqlx::any::install_default_drivers();
    let (url, cleanup) = match backend {
        Backend::Postgres => {
            let name = format!("payments_test_{}", uuid::Uuid::new_v4().simple());
            let admin = admin_url();
            let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
                panic!("PostgreSQL is required and not reachable at {admin}: {e}")
            });
            sqlx::query(&format!("CREATE DATABASE {name} {options}"))
                .execute(&mut conn)
                .await
                .expect("create database");
            let base = admin
                .rsplit_once('/')
                .map_or(admin.as_str(), |(base, _)| base);
            (format!("{base}/{name}"), Cleanup::DropDatabase(name))
        }
        Backend::Sqlite => {
            let dir = std::env::temp_dir()
                .join(format!("payments-test-{}", uuid::Uuid::new_v4().simple()));
            let url = format!("sqlite://{}", dir.join("payments.db").display());
            (url, Cleanup::RemoveDirectory(dir))
        }
    };
    let settings = PoolSettings {
        max_connections: 20,
        acquire_timeout: std::time::Duration::from_secs(10),
        statement_timeout: std::time::Duration::from_secs(30),
        lock_timeout: std::time::Duration::from_secs(30),
        idle_in_transaction_timeout: std::time::Duration::from_secs(60),
    };
    let database = Database::parse(&url).expect("test database URL");
    let store = payments_storage::open_store(&database, &settings, IdempotencyPolicy::default())
        .await
        .expect("open and migrate the test database");
    let records = store.records();
    let raw = AnyPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("connect to the test database");
    TestDb {
        store,
        records,
        raw,
        backend,
        _cleanup: cleanup,
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        match self {
            Cleanup::RemoveDirectory(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::DropDatabase(name) => {
                let name = name.clone();
                let _ = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async {
                        if let Ok(mut conn) = PgConnection::connect(&admin_url()).await {
                            let _ = sqlx::query(&format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            ))
                            .execute(&mut conn)
                            .await;
                        }
                    });
                })
                .join();
            }
        }
    }
}

impl TestDb {
    /// Moves the named time columns of every record one second into the past, by the
    /// database's own clock (the clock the store judges expiry by).
    async fn move_into_past(&self, columns: &[&str]) {
        let past = match self.backend {
            Backend::Postgres => "now() - interval '1 second'",
            Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 seconds')",
        };
        let set: Vec<String> = columns.iter().map(|c| format!("{c} = {past}")).collect();
        let sql = format!("UPDATE idempotency_records SET {}", set.join(", "));
        sqlx::query(&sql).execute(&self.raw).await.expect(&sql);
    }

    /// An SQL expression for the database's clock `secs` seconds ago.
    fn ago(&self, secs: u32) -> String {
        match self.backend {
            Backend::Postgres => format!("now() - interval '{secs} seconds'"),
            Backend::Sqlite => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{secs} seconds')"),
        }
    }

    async fn execute(&self, sql: &str) {
        sqlx::query(sql).execute(&self.raw).await.expect(sql);
    }

    /// Claims `k` for the request with fingerprint 100, which must win the record.
    async fn claim_owned(&self, s: &Scope, k: &IdempotencyKey) -> Claimed {
        owned(
            self.records
                .claim(s, k, &fingerprint(100), b"{}")
                .await
                .expect("claim"),
        )
    }

    /// The record under `k`, which must exist.
    async fn record(
        &self,
        s: &Scope,
        k: &IdempotencyKey,
    ) -> payments_idempotency::IdempotencyRecord {
        let found = self.records.find_record(s, k).await.expect("read");
        found.map(|(record, _)| record).expect("a record")
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&self.raw)
            .await
            .expect("count")
    }
}

fn scope() -> Scope {
    Scope {
        tenant: "acme".into(),
        operation: CHARGES_CREATE.into(),
    }
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::parse(text).expect("valid key")
}

fn fingerprint(amount: i64) -> Fingerprint {
    Fingerprint::of_json_request("POST", "/charges", &json!({ "amount": amount }))
}

fn owned(claim: Claim) -> Claimed {
    match claim {
        Claim::Owned(claimed) => claimed,
        other => panic!("expected to own the record, got {other:?}"),
    }
}

fn charge_for(claimed: &Claimed) -> Charge {
    Charge {
        id: ChargeId::from_uuid(claimed.generation),
        tenant: TenantId::new("acme"),
        money: Money::new(Amount::new(100).expect("amount"), Currency::Usd),
        source: PaymentSource::new("tok_visa").expect("source"),
        description: None,
        processor_charge_id: format!("sim_{}", claimed.attempt.0),
        created_at: Utc::now(),
        amount_refunded: 0,
        capture: payments_domain::Capture::Automatic,
    }
}

fn response(body: &str) -> StoredResponse {
    StoredResponse::new(
        SchemaVersion::new(1),
        201,
        [("content-type", "application/json")],
        body.as_bytes().to_vec(),
    )
}

async fn a_stale_record_is_taken_over_and_the_old_attempt_is_fenced_off(backend: Backend) {
    let db = test_db(backend).await;
    let first = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    assert_eq!(first.attempt, Attempt(1));

    // While the lock is live a duplicate is refused.
    let duplicate = db
        .records
        .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
        .await
        .expect("claim");
    assert!(matches!(duplicate, Claim::InFlight { retry_after_secs } if retry_after_secs >= 1));

    db.move_into_past(&["locked_until"]).await;
    let second = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("takeover"),
    );
    assert_eq!(second.attempt, Attempt(2));
    assert!(second.took_over);
    assert_eq!(
        (second.generation, &second.effect_key),
        (first.generation, &first.effect_key)
    );

    // The first attempt wakes up: none of its writes lands.
    let s = scope();
    let k = key("k");
    assert_eq!(
        db.records
            .record_effect(Owner::new(&s, &k, first.fence()), "sim_old")
            .await
            .expect("write"),
        Finish::Fenced
    );
    let late = db
        .store
        .finish_charge(
            Owner::new(&s, &k, first.fence()),
            &charge_for(&first),
            &response("old"),
        )
        .await;
    assert_eq!(late.expect("write"), Completion::Fenced);
    assert_eq!(
        (db.count("charges").await, db.count("outbox_events").await),
        (0, 0)
    );

    let done = db
        .store
        .finish_charge(
            Owner::new(&s, &k, second.fence()),
            &charge_for(&second),
            &response("new"),
        )
        .await;
    assert!(matches!(done.expect("write"), Completion::Stored { .. }));
    assert_eq!(
        [
            db.count("charges").await,
            db.count("ledger_transactions").await,
            db.count("ledger_entries").await,
            db.count("outbox_events").await
        ],
        [1, 1, 2, 1]
    );
    // A second finish by the winner writes nothing: the record is no longer pending. A store
    // that checks the fence when the record ends (PostgreSQL) meets the charge it already
    // wrote first, and the engine then answers from the record.
    let again = db
        .store
        .finish_charge(
            Owner::new(&s, &k, second.fence()),
            &charge_for(&second),
            &response("new"),
        )
        .await;
    match again {
        Ok(completion) => assert_eq!(completion, Completion::Fenced),
        Err(error) => assert!(
            matches!(
                error.downcast_ref::<StoreError>(),
                Some(StoreError::Constraint { constraint, .. }) if constraint == "charges_pkey"
            ),
            "{error:?}"
        ),
    }
    assert_eq!(db.count("charges").await, 1);

    let replay = db
        .records
        .claim(&s, &k, &fingerprint(100), b"{}")
        .await
        .expect("claim");
    assert!(matches!(replay, Claim::Replay { response: r, .. } if r == response("new")));
}

async fn a_takeover_resumes_from_charged_with_the_effect_id(backend: Backend) {
    let db = test_db(backend).await;
    let first = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    assert_eq!(
        db.records
            .record_effect(Owner::new(&scope(), &key("k"), first.fence()), "sim_42")
            .await
            .expect("write"),
        Finish::Written
    );
    db.move_into_past(&["locked_until"]).await;

    let second = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("takeover"),
    );
    assert_eq!(second.resume_from, RecoveryPoint::EffectMade);
    assert_eq!(second.effect_id.as_deref(), Some("sim_42"));
}

async fn a_failed_record_is_retried_as_a_new_generation_with_a_new_processor_key(backend: Backend) {
    let db = test_db(backend).await;
    let first = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    let failed = db
        .store
        .fail(Owner::new(&scope(), &key("k"), first.fence()))
        .await
        .expect("write");
    assert!(matches!(failed, Completion::Stored { .. }));

    let retry = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("retry"),
    );
    assert_eq!(retry.attempt, Attempt(2));
    assert!(retry.replaced);
    // The old processor key is tombstoned at the processor: the retry must not reuse it.
    assert_ne!(retry.effect_key, first.effect_key);
    assert_ne!(retry.generation, first.generation);
    assert_eq!(retry.resume_from, RecoveryPoint::Started);
    // A different payload still cannot use the key.
    assert_eq!(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(999), b"{}")
            .await
            .expect("claim"),
        Claim::Mismatch
    );
}

/// A replay, a 409 and a 422 are answered from one lock-free read: they wait for no row lock
/// (PostgreSQL) and no write lock (SQLite), even while another transaction holds one.
async fn answers_from_a_record_need_no_lock(backend: Backend) {
    let db = test_db(backend).await;
    let (s, k, busy) = (scope(), key("k"), key("busy"));
    let claimed = db.claim_owned(&s, &k).await;
    db.store
        .finish_charge(
            Owner::new(&s, &k, claimed.fence()),
            &charge_for(&claimed),
            &response("done"),
        )
        .await
        .expect("finish");
    db.claim_owned(&s, &busy).await;

    // Another transaction holds the lock: the record's row lock on PostgreSQL, the database's
    // write lock on SQLite.
    let mut holder = db.raw.acquire().await.expect("connection");
    let lock = match backend {
        Backend::Postgres => "BEGIN; SELECT 1 FROM idempotency_records FOR UPDATE",
        Backend::Sqlite => "BEGIN IMMEDIATE",
    };
    for statement in lock.split("; ") {
        sqlx::query(statement)
            .execute(&mut *holder)
            .await
            .expect("take the lock");
    }
    let answers = async {
        (
            db.records.claim(&s, &k, &fingerprint(100), b"{}").await,
            db.records.claim(&s, &k, &fingerprint(999), b"{}").await,
            db.records.claim(&s, &busy, &fingerprint(100), b"{}").await,
        )
    };
    let (replay, mismatch, in_flight) =
        tokio::time::timeout(std::time::Duration::from_secs(5), answers)
            .await
            .expect("answered without waiting for the lock");
    assert!(
        matches!(replay.expect("claim"), Claim::Replay { response: r, .. } if r == response("done"))
    );
    assert_eq!(mismatch.expect("claim"), Claim::Mismatch);
    assert!(matches!(in_flight.expect("claim"), Claim::InFlight { .. }));
    sqlx::query("ROLLBACK")
        .execute(&mut *holder)
        .await
        .expect("release the lock");
}

/// A record reaped and claimed again restarts at attempt 1: only the generation (the resource
/// id) tells the old attempt 1 from the new one.
async fn a_stale_writer_from_a_reaped_generation_writes_nothing(backend: Backend) {
    let db = test_db(backend).await;
    let (s, k) = (scope(), key("k"));
    let old = db.claim_owned(&s, &k).await;
    sqlx::query("DELETE FROM idempotency_records")
        .execute(&db.raw)
        .await
        .expect("reap");
    let new = db.claim_owned(&s, &k).await;
    assert_eq!((old.attempt, new.attempt), (Attempt(1), Attempt(1)));

    let stale = old.fence();
    assert_eq!(
        db.records
            .record_effect(Owner::new(&s, &k, stale), "sim_old")
            .await
            .expect("write"),
        Finish::Fenced
    );
    assert_eq!(
        db.records
            .release(Owner::new(&s, &k, stale))
            .await
            .expect("write"),
        Finish::Fenced
    );
    assert_eq!(
        db.store
            .finish_charge(
                Owner::new(&s, &k, stale),
                &charge_for(&old),
                &response("old")
            )
            .await
            .expect("write"),
        Completion::Fenced
    );
    assert_eq!(
        db.store
            .complete_without_effect(Owner::new(&s, &k, stale), &response("old"))
            .await
            .expect("write"),
        Completion::Fenced
    );
    assert_eq!(
        db.store
            .fail(Owner::new(&s, &k, stale))
            .await
            .expect("write"),
        Completion::Fenced
    );
    assert_eq!(db.count("charges").await, 0);
    let record = db.record(&s, &k).await;
    assert_eq!(
        (
            record.state.as_str(),
            record.recovery_point,
            record.effect_id
        ),
        ("pending", RecoveryPoint::Started, None)
    );
    // The new generation's own writes pass.
    assert!(matches!(
        db.store
            .finish_charge(
                Owner::new(&s, &k, new.fence()),
                &charge_for(&new),
                &response("new")
            )
            .await
            .expect("write"),
        Completion::Stored { .. }
    ));
}

/// Retention is counted from the completion: a record completed just before its claim-time
/// expiry is replayed for a whole TTL afterwards.
async fn every_completion_counts_retention_from_itself(backend: Backend) {
    let db = test_db(backend).await;
    let (s, k) = (scope(), key("k"));
    let claimed = db.claim_owned(&s, &k).await;
    db.move_into_past(&["expires_at"]).await;
    let before = Utc::now();
    let Completion::Stored { expires_at } = db
        .store
        .finish_charge(
            Owner::new(&s, &k, claimed.fence()),
            &charge_for(&claimed),
            &response("a"),
        )
        .await
        .expect("finish")
    else {
        panic!("the owner's finish is fenced");
    };
    let ttl = chrono::Duration::from_std(IdempotencyPolicy::default().ttl).expect("ttl");
    let slack = chrono::Duration::seconds(5);
    assert!(
        expires_at > before + ttl - slack && expires_at < before + ttl + slack,
        "expires_at {expires_at} is one TTL after the finish at {before}"
    );
    let record = db.record(&s, &k).await;
    assert_eq!(record.expires_at, expires_at);
    assert!(matches!(
        db.records
            .claim(&s, &k, &fingerprint(100), b"{}")
            .await
            .expect("claim"),
        Claim::Replay { .. }
    ));
}

/// An effect id that is known must reach the ledger: such a record is never failed, never
/// completed without its effect, and never reaped while it is not completed.
async fn a_record_holding_an_effect_id_is_never_failed_nor_reaped_without_its_charge(
    backend: Backend,
) {
    let db = test_db(backend).await;
    let (s, k) = (scope(), key("k"));
    let claimed = db.claim_owned(&s, &k).await;
    db.records
        .record_effect(Owner::new(&s, &k, claimed.fence()), "sim_known")
        .await
        .expect("charged");
    assert_eq!(
        db.store
            .fail(Owner::new(&s, &k, claimed.fence()))
            .await
            .expect("write"),
        Completion::Fenced
    );
    // Nor completed with an answer that made nothing: its effect must reach the ledger.
    let declined = StoredResponse::new(SchemaVersion::new(1), 402, [], b"declined".to_vec());
    assert_eq!(
        db.store
            .complete_without_effect(Owner::new(&s, &k, claimed.fence()), &declined)
            .await
            .expect("write"),
        Completion::Fenced
    );
    // Even a record an older version failed with its charge id is kept past its expiry.
    sqlx::query("UPDATE idempotency_records SET state = 'failed', locked_until = NULL")
        .execute(&db.raw)
        .await
        .expect("fail by hand");
    db.move_into_past(&["expires_at"]).await;
    assert_eq!(db.records.reap_expired(100).await.expect("reap"), 0);
    assert_eq!(db.count("idempotency_records").await, 1);
    // The same request resumes it from `charged`, never as a new generation.
    let resumed = db.claim_owned(&s, &k).await;
    assert_eq!(
        (resumed.resume_from, resumed.effect_id.as_deref()),
        (RecoveryPoint::EffectMade, Some("sim_known"))
    );
}

/// The completer waits out the settle grace after a lock ends: a processor call made under
/// the lock may still be processing until then.
async fn the_completer_takes_a_released_record_only_after_the_settle_grace(backend: Backend) {
    let db = test_db(backend).await;
    let (s, k) = (scope(), key("k"));
    let claimed = db.claim_owned(&s, &k).await;
    db.records
        .release(Owner::new(&s, &k, claimed.fence()))
        .await
        .expect("release");
    let grace = std::time::Duration::from_secs(30);
    assert!(
        db.records
            .take_over_abandoned(grace)
            .await
            .expect("take")
            .is_none()
    );
    // A client retry may take the released record at once.
    let retry = db.claim_owned(&s, &k).await;
    assert!(retry.took_over);
    db.records
        .release(Owner::new(&s, &k, retry.fence()))
        .await
        .expect("release");
    db.move_into_past(&["locked_until"]).await;
    let taken = db
        .records
        .take_over_abandoned(std::time::Duration::from_millis(500))
        .await
        .expect("take")
        .expect("the record is past its grace");
    assert_eq!(
        taken.fence(),
        Fence {
            attempt: Attempt(3),
            generation: claimed.generation
        }
    );
}

async fn an_expired_finished_record_is_replaced_by_a_new_request(backend: Backend) {
    let db = test_db(backend).await;
    let first = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    let declined = StoredResponse::new(SchemaVersion::new(1), 402, [], b"declined".to_vec());
    db.store
        .complete_without_effect(Owner::new(&scope(), &key("k"), first.fence()), &declined)
        .await
        .expect("finish");
    assert_eq!(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(999), b"{}")
            .await
            .expect("claim"),
        Claim::Mismatch
    );

    db.move_into_past(&["expires_at"]).await;
    let fresh = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(999), b"{}")
            .await
            .expect("claim"),
    );
    assert_eq!(fresh.resume_from, RecoveryPoint::Started);
    assert!(!fresh.took_over);
    assert_ne!(
        fresh.generation, first.generation,
        "a new request creates a new charge"
    );
    assert_ne!(
        fresh.effect_key, first.effect_key,
        "and must not be deduplicated into the old one"
    );
    assert_eq!(
        fresh.attempt,
        Attempt(2),
        "attempts keep counting so old stragglers stay fenced"
    );
}

async fn an_unfinished_record_never_expires_away(backend: Backend) {
    let db = test_db(backend).await;
    owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    db.move_into_past(&["expires_at", "locked_until"]).await;
    // The card may have been charged: another payload is refused, the same one resumes.
    assert_eq!(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(999), b"{}")
            .await
            .expect("claim"),
        Claim::Mismatch
    );
    let resumed = owned(
        db.records
            .claim(&scope(), &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    assert!(resumed.took_over);
}

async fn keys_are_scoped_by_tenant_and_operation(backend: Backend) {
    let db = test_db(backend).await;
    let other_tenant = Scope {
        tenant: "globex".into(),
        operation: CHARGES_CREATE.into(),
    };
    let other_operation = Scope {
        tenant: "acme".into(),
        operation: REFUNDS_CREATE.into(),
    };
    for scope in [scope(), other_tenant, other_operation] {
        let claim = db
            .records
            .claim(&scope, &key("k"), &fingerprint(100), b"{}")
            .await
            .expect("claim");
        assert!(matches!(claim, Claim::Owned(_)), "{scope:?}");
    }
    assert_eq!(db.count("idempotency_records").await, 3);
}

/// The finish is all or nothing: when one of its writes is refused (here the processor charge
/// is already recorded under another key), the record stays pending and no row is left behind.
async fn a_finish_refused_part_way_writes_nothing(backend: Backend) {
    let db = test_db(backend).await;
    let s = scope();
    let first = owned(
        db.records
            .claim(&s, &key("first"), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    let written = db
        .store
        .finish_charge(
            Owner::new(&s, &key("first"), first.fence()),
            &charge_for(&first),
            &response("a"),
        )
        .await;
    assert!(matches!(
        written.expect("finish"),
        Completion::Stored { .. }
    ));

    let second = owned(
        db.records
            .claim(&s, &key("second"), &fingerprint(200), b"{}")
            .await
            .expect("claim"),
    );
    let mut duplicate = charge_for(&second);
    duplicate.processor_charge_id = charge_for(&first).processor_charge_id;
    let refused = db
        .store
        .finish_charge(
            Owner::new(&s, &key("second"), second.fence()),
            &duplicate,
            &response("b"),
        )
        .await;
    assert!(
        refused.is_err(),
        "the duplicate processor charge is refused"
    );
    assert_eq!(
        [
            db.count("charges").await,
            db.count("ledger_transactions").await,
            db.count("ledger_entries").await,
            db.count("outbox_events").await,
        ],
        [1, 1, 2, 1],
        "only the first finish left rows"
    );
    let record = db.record(&s, &key("second")).await;
    assert_eq!(
        (record.state.as_str(), record.response.is_none()),
        ("pending", true),
        "the refused finish did not complete the record"
    );
}

/// Claims `name` and finishes it with a charge of its own, which writes one outbox row.
async fn write_charge(db: &TestDb, name: &str) -> ChargeId {
    let claimed = owned(
        db.records
            .claim(&scope(), &key(name), &fingerprint(100), b"{}")
            .await
            .expect("claim"),
    );
    let mut charge = charge_for(&claimed);
    charge.processor_charge_id = format!("sim_{name}");
    let done = db
        .store
        .finish_charge(
            Owner::new(&scope(), &key(name), claimed.fence()),
            &charge,
            &response(name),
        )
        .await;
    assert!(matches!(done.expect("finish"), Completion::Stored { .. }));
    charge.id
}

async fn only_published_events_past_their_retention_are_pruned(backend: Backend) {
    let db = test_db(backend).await;
    let unpublished = "outbox_events WHERE published_at IS NULL";
    // Two events published two hours ago, one published a minute ago, and one written two
    // hours ago and never published.
    write_charge(&db, "old-published-1").await;
    write_charge(&db, "old-published-2").await;
    db.execute(&format!(
        "UPDATE outbox_events SET published_at = {}",
        db.ago(7200)
    ))
    .await;
    write_charge(&db, "recent-published").await;
    db.execute(&format!(
        "UPDATE outbox_events SET published_at = {} WHERE published_at IS NULL",
        db.ago(60)
    ))
    .await;
    write_charge(&db, "old-unpublished").await;
    db.execute(&format!(
        "UPDATE outbox_events SET created_at = {} WHERE published_at IS NULL",
        db.ago(7200)
    ))
    .await;
    assert_eq!(
        (db.count("outbox_events").await, db.count(unpublished).await),
        (4, 1)
    );

    let hour = Duration::from_secs(3600);
    // At most a batch at a time.
    assert_eq!(
        db.store
            .prune_events(EventPruning::Published, hour, 1)
            .await
            .expect("prune"),
        1
    );
    assert_eq!(
        db.store
            .prune_events(EventPruning::Published, hour, 10)
            .await
            .expect("prune"),
        1
    );
    assert_eq!(
        db.store
            .prune_events(EventPruning::Published, hour, 10)
            .await
            .expect("prune"),
        0
    );
    assert_eq!(
        (db.count("outbox_events").await, db.count(unpublished).await),
        (2, 1),
        "the recent published row and the old unpublished row stay"
    );

    // However short the retention, an unpublished row stays.
    let second = Duration::from_secs(1);
    assert_eq!(
        db.store
            .prune_events(EventPruning::Published, second, 10)
            .await
            .expect("prune"),
        1
    );
    assert_eq!(
        (db.count("outbox_events").await, db.count(unpublished).await),
        (1, 1)
    );
}

/// The reaper takes the longest expired records first, a batch at a time, along the expiry
/// index; records not yet expired stay.
/// Without a stream nothing marks a row published: the events API is the outbox's only
/// reader, and rows go by age alone, published or not.
async fn without_a_stream_events_past_their_retention_are_pruned_by_age(backend: Backend) {
    let db = test_db(backend).await;
    write_charge(&db, "old-1").await;
    write_charge(&db, "old-2").await;
    db.execute(&format!(
        "UPDATE outbox_events SET created_at = {}",
        db.ago(7200)
    ))
    .await;
    write_charge(&db, "recent").await;

    let hour = Duration::from_secs(3600);
    let prune = |batch| db.store.prune_events(EventPruning::ByAge, hour, batch);
    assert_eq!(
        prune(1).await.expect("prune"),
        1,
        "at most a batch at a time"
    );
    assert_eq!(prune(10).await.expect("prune"), 1);
    assert_eq!(prune(10).await.expect("prune"), 0);
    let left = visible_events(&db, 1).await;
    assert_eq!(left[0].payload["amount"], 100, "the recent row stays");
}

/// The tenant's events once the feed shows `count` of them. On PostgreSQL it shows an event
/// only once every transaction older than its writer has ended, on the whole server: other
/// tests' transactions (one holds its own open on purpose) can delay it a moment.
async fn visible_events(db: &TestDb, count: usize) -> Vec<payments_storage::StoredEvent> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let page = db.store.list_events(&tenant(), feed(100, None)).await;
        let events = page.expect("list").expect("no cursor").events;
        if events.len() >= count || std::time::Instant::now() > deadline {
            assert_eq!(events.len(), count, "the feed shows exactly these");
            return events;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn tenant() -> TenantId {
    TenantId::new("acme")
}

fn feed(limit: u32, starting_after: Option<EventId>) -> ListEvents {
    ListEvents {
        limit,
        starting_after,
        event_type: None,
    }
}

/// The feed of one tenant, in the order its events were written, in pages that neither skip
/// nor repeat; another tenant's events and cursors are not found.
async fn the_events_feed_pages_through_a_tenants_events_in_order(backend: Backend) {
    let db = test_db(backend).await;
    let mut written = Vec::new();
    for i in 0..7 {
        written.push(write_charge(&db, &format!("feed-{i}")).await.to_string());
    }
    visible_events(&db, written.len()).await;
    let mut seen = Vec::new();
    let mut charges = Vec::new();
    let mut cursor = None;
    loop {
        let page = db.store.list_events(&tenant(), feed(3, cursor)).await;
        let page = page.expect("list").expect("a known cursor");
        seen.extend(page.events.iter().map(|e| e.id));
        charges.extend(
            page.events
                .iter()
                .map(|e| e.payload["charge_id"].to_string()),
        );
        cursor = page.events.last().map(|e| e.id);
        if !page.has_more {
            break;
        }
    }
    let written: Vec<String> = written.iter().map(|id| format!("\"{id}\"")).collect();
    assert_eq!(charges, written, "every event once, in the order written");

    let other = TenantId::new("globex");
    let theirs = db.store.list_events(&other, feed(10, None)).await;
    assert!(theirs.expect("list").expect("no cursor").events.is_empty());
    let cursor = db.store.list_events(&other, feed(10, Some(seen[0]))).await;
    assert!(
        cursor.expect("list").is_none(),
        "another tenant's cursor is unknown"
    );
    let found = db.store.get_event(&other, seen[0]).await.expect("get");
    assert!(found.is_none());
}

async fn the_reaper_deletes_the_longest_expired_records_first(backend: Backend) {
    let db = test_db(backend).await;
    for (name, secs) in [("mid", 200), ("new", 100), ("old", 300)] {
        write_charge(&db, name).await;
        db.execute(&format!(
            "UPDATE idempotency_records SET expires_at = {} WHERE idempotency_key = '{name}'",
            db.ago(secs)
        ))
        .await;
    }
    write_charge(&db, "live").await;
    let mut left = Vec::new();
    for _ in 0..3 {
        assert_eq!(db.records.reap_expired(1).await.expect("reap"), 1);
        let keys: Vec<String> = sqlx::query_scalar(
            "SELECT idempotency_key FROM idempotency_records ORDER BY idempotency_key",
        )
        .fetch_all(&db.raw)
        .await
        .expect("keys");
        left.push(keys.join(","));
    }
    assert_eq!(left, ["live,mid,new", "live,new", "live"]);
    assert_eq!(db.records.reap_expired(10).await.expect("reap"), 0);
}

fn refund_scope() -> Scope {
    Scope {
        tenant: "acme".into(),
        operation: REFUNDS_CREATE.into(),
    }
}

/// A charge of 100, finished through the store, and its id.
async fn charged(db: &TestDb) -> ChargeId {
    let (s, k) = (scope(), key("the-charge"));
    let claimed = db.claim_owned(&s, &k).await;
    let charge = charge_for(&claimed);
    let done = db
        .store
        .finish_charge(
            Owner::new(&s, &k, claimed.fence()),
            &charge,
            &response("charge"),
        )
        .await
        .expect("finish the charge");
    assert!(matches!(done, Completion::Stored { .. }));
    charge.id
}

fn refund_of(charge: ChargeId, amount: Option<i64>) -> RefundRequest {
    RefundRequest {
        charge,
        amount: amount.map(|a| Amount::new(a).expect("amount")),
        reason: None,
    }
}

impl TestDb {
    /// Claims refund key `name` and reserves `amount` (all that is left if none) under it.
    async fn reserve(
        &self,
        name: &str,
        charge: ChargeId,
        amount: Option<i64>,
    ) -> (Claimed, Reservation) {
        let (s, k) = (refund_scope(), key(name));
        let claimed = self.claim_owned(&s, &k).await;
        let reservation = self
            .store
            .reserve_refund(
                Owner::new(&s, &k, claimed.fence()),
                &refund_of(charge, amount),
                created_at(),
            )
            .await
            .expect("reserve")
            .expect("the claim's own record");
        (claimed, reservation)
    }

    /// The charge's refunded and reserved amounts.
    async fn refunded_and_reserved(&self) -> (i64, i64) {
        sqlx::query_as("SELECT amount_refunded, amount_reserved FROM charges")
            .fetch_one(&self.raw)
            .await
            .expect("the charge")
    }
}

/// Now, at the microseconds the databases keep, as the service passes a refund's creation time.
fn created_at() -> chrono::DateTime<Utc> {
    use chrono::DurationRound;
    Utc::now()
        .duration_trunc(chrono::TimeDelta::microseconds(1))
        .expect("truncate")
}

fn reserved(reservation: Reservation) -> payments_domain::Refund {
    match reservation {
        Reservation::Reserved { refund, .. } => refund,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

async fn a_reservation_is_made_once_per_generation_and_never_exceeds_the_charge(backend: Backend) {
    let db = test_db(backend).await;
    let charge = charged(&db).await;
    let (claimed, first) = db.reserve("refund-1", charge, Some(60)).await;
    let first = reserved(first);
    assert_eq!(
        first.id.as_uuid(),
        claimed.generation,
        "the refund is the generation's"
    );
    let again = db
        .store
        .reserve_refund(
            Owner::new(&refund_scope(), &key("refund-1"), claimed.fence()),
            &refund_of(charge, Some(60)),
            created_at(),
        )
        .await
        .expect("reserve again")
        .expect("the claim's own record");
    assert_eq!(reserved(again), first, "a generation reserves once");
    assert_eq!(db.refunded_and_reserved().await, (0, 60));

    let (_, too_large) = db.reserve("refund-2", charge, Some(41)).await;
    assert!(
        matches!(
            too_large,
            Reservation::Refused(RefundRefusal::TooLarge { refundable: 40 })
        ),
        "{too_large:?}"
    );
    let (_, rest) = db.reserve("refund-3", charge, None).await;
    assert_eq!(
        reserved(rest).money.amount.minor_units(),
        40,
        "no amount takes what is left"
    );
    let (_, nothing) = db.reserve("refund-4", charge, None).await;
    assert!(
        matches!(nothing, Reservation::Refused(RefundRefusal::NothingLeft)),
        "{nothing:?}"
    );
    assert_eq!(db.refunded_and_reserved().await, (0, 100));
    assert_eq!(db.count("refunds").await, 2);
}

async fn a_fenced_off_attempt_reserves_nothing(backend: Backend) {
    let db = test_db(backend).await;
    let charge = charged(&db).await;
    let (s, k) = (refund_scope(), key("refund"));
    let claimed = db.claim_owned(&s, &k).await;
    let taken_over = Fence {
        attempt: Attempt(claimed.attempt.0 + 1),
        generation: claimed.generation,
    };
    let reservation = db
        .store
        .reserve_refund(
            Owner::new(&s, &k, taken_over),
            &refund_of(charge, Some(10)),
            created_at(),
        )
        .await
        .expect("reserve");
    assert!(reservation.is_none(), "{reservation:?}");
    assert_eq!(db.refunded_and_reserved().await, (0, 0));
    assert_eq!(db.count("refunds").await, 0);
}

async fn a_refund_ended_without_a_refund_releases_its_reservation_and_a_finished_one_posts_it(
    backend: Backend,
) {
    let db = test_db(backend).await;
    let charge = charged(&db).await;
    let s = refund_scope();

    let (declined, _) = db.reserve("declined", charge, Some(30)).await;
    let done = db
        .store
        .end_refund(
            Owner::new(&s, &key("declined"), declined.fence()),
            Unmade::Answered(&response("402")),
        )
        .await
        .expect("refuse");
    assert!(matches!(done, Completion::Stored { .. }));
    assert_eq!(
        db.refunded_and_reserved().await,
        (0, 0),
        "a refusal releases"
    );

    let (canceled, _) = db.reserve("canceled", charge, Some(30)).await;
    let failed = db
        .store
        .end_refund(
            Owner::new(&s, &key("canceled"), canceled.fence()),
            Unmade::Tombstoned,
        )
        .await
        .expect("fail");
    assert!(matches!(failed, Completion::Stored { .. }));
    assert_eq!(
        db.refunded_and_reserved().await,
        (0, 0),
        "a failure releases"
    );
    assert_eq!(db.count("refunds").await, 0);

    let (made, reservation) = db.reserve("made", charge, Some(30)).await;
    let refund = reserved(reservation).succeeded("re_sim_1".into());
    let done = db
        .store
        .finish_refund(
            Owner::new(&s, &key("made"), made.fence()),
            &refund,
            &response("201"),
        )
        .await
        .expect("finish");
    assert!(matches!(done, Completion::Stored { .. }));
    assert_eq!(db.refunded_and_reserved().await, (30, 30));
    let late_failure = db
        .store
        .end_refund(
            Owner::new(&s, &key("made"), made.fence()),
            Unmade::Tombstoned,
        )
        .await
        .expect("fail");
    assert_eq!(
        late_failure,
        Completion::Fenced,
        "a finished refund is never released"
    );
    assert_eq!(db.refunded_and_reserved().await, (30, 30));
    assert_eq!(
        (
            db.count("refunds").await,
            db.count("ledger_transactions").await,
            db.count("outbox_events").await
        ),
        (1, 2, 2)
    );
}

/// A database of `backend` with nothing in it but the record store's table, as another service
/// applies it (`SqlRecords::create_schema`, from `crates/idempotency-sql/schema/`).
async fn records_table_alone(backend: Backend) -> (SqlRecords, Cleanup) {
    let name = format!("payments_test_{}", uuid::Uuid::new_v4().simple());
    let (url, cleanup) = match backend {
        Backend::Postgres => {
            let admin = admin_url();
            let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
            (format!("{base}/{name}"), Cleanup::DropDatabase(name))
        }
        Backend::Sqlite => {
            let dir = std::env::temp_dir().join(name);
            let url = format!("sqlite://{}", dir.join("records.db").display());
            (url, Cleanup::RemoveDirectory(dir))
        }
    };
    let settings = PoolSettings {
        max_connections: 2,
        acquire_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(30),
        lock_timeout: Duration::from_secs(30),
        idle_in_transaction_timeout: Duration::from_secs(60),
    };
    let database = Database::parse(&url).expect("test database URL");
    let records = database
        .open(&settings, IdempotencyPolicy::default())
        .await
        .expect("open the records' database");
    records
        .create_schema()
        .await
        .expect("apply the records table");
    (records, cleanup)
}

/// The records table's columns: name, type, nullable, default.
async fn record_columns(records: &SqlRecords) -> Vec<(String, String, bool, Option<String>)> {
    match records {
        SqlRecords::Postgres(records) => sqlx::query_as(
            "SELECT column_name::text, data_type::text, is_nullable = 'YES', column_default::text
             FROM information_schema.columns
             WHERE table_name = 'idempotency_records' AND table_schema = current_schema()
             ORDER BY column_name",
        )
        .fetch_all(records.pool())
        .await,
        SqlRecords::Sqlite(records) => {
            sqlx::query_as(
                "SELECT name, type, \"notnull\" = 0, dflt_value
             FROM pragma_table_info('idempotency_records') ORDER BY name",
            )
            .fetch_all(records.pool())
            .await
        }
    }
    .expect("read the records table's columns")
}

/// The table another service applies for the record store and the one this service's
/// migrations built over time have the same columns: the record store's statements run on
/// either.
async fn the_records_table_a_service_applies_is_the_one_the_migrations_build(backend: Backend) {
    let db = test_db(backend).await;
    let (applied, _cleanup) = records_table_alone(backend).await;
    let migrated = record_columns(&db.records).await;
    assert_eq!(migrated.len(), 20, "{migrated:?}");
    assert_eq!(record_columns(&applied).await, migrated);
}

on_every_backend!(
    the_records_table_a_service_applies_is_the_one_the_migrations_build,
    a_reservation_is_made_once_per_generation_and_never_exceeds_the_charge,
    a_fenced_off_attempt_reserves_nothing,
    a_refund_ended_without_a_refund_releases_its_reservation_and_a_finished_one_posts_it,
    a_finish_refused_part_way_writes_nothing,
    a_stale_record_is_taken_over_and_the_old_attempt_is_fenced_off,
    a_takeover_resumes_from_charged_with_the_effect_id,
    a_failed_record_is_retried_as_a_new_generation_with_a_new_processor_key,
    a_stale_writer_from_a_reaped_generation_writes_nothing,
    answers_from_a_record_need_no_lock,
    every_completion_counts_retention_from_itself,
    a_record_holding_an_effect_id_is_never_failed_nor_reaped_without_its_charge,
    the_completer_takes_a_released_record_only_after_the_settle_grace,
    an_expired_finished_record_is_replaced_by_a_new_request,
    an_unfinished_record_never_expires_away,
    keys_are_scoped_by_tenant_and_operation,
    only_published_events_past_their_retention_are_pruned,
    without_a_stream_events_past_their_retention_are_pruned_by_age,
    the_events_feed_pages_through_a_tenants_events_in_order,
    the_reaper_deletes_the_longest_expired_records_first,
);

/// PostgreSQL's transactions commit out of the order they wrote their events in; SQLite has one
/// writer at a time, so there the question does not arise.
mod postgres_feed {
    use super::*;

    /// An event written later but committed first is held back until every event that could
    /// come before it has committed: a client that had paged past it would otherwise never
    /// see the earlier one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_later_commit_waits_for_an_earlier_writer_still_open() {
        let db = test_db(Backend::Postgres).await;
        let mut earlier = db.raw.begin().await.expect("begin");
        sqlx::query(
            "INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
             VALUES (gen_random_uuid(), 'acme', 'payment.completed', gen_random_uuid(),
                     '{\"charge_id\": \"earlier\"}')",
        )
        .execute(&mut *earlier)
        .await
        .expect("insert");
        write_charge(&db, "later").await;

        let page = db.store.list_events(&tenant(), feed(10, None)).await;
        let page = page.expect("list").expect("no cursor");
        assert!(
            page.events.is_empty(),
            "the later event must wait for the earlier writer, got {:?}",
            page.events
        );

        earlier.commit().await.expect("commit");
        // Transactions of other tests on the same server can hold the horizon back a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let events = loop {
            let page = db.store.list_events(&tenant(), feed(10, None)).await;
            let events = page.expect("list").expect("no cursor").events;
            if events.len() == 2 || std::time::Instant::now() > deadline {
                break events;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let charges: Vec<_> = events
            .iter()
            .map(|e| e.payload["charge_id"].clone())
            .collect();
        assert_eq!(charges.len(), 2, "{charges:?}");
        assert_eq!(
            charges[0], "earlier",
            "the earlier writer's event comes first"
        );
    }
}

/// Two transactions that write the ledger (two batches of finishes, on two instances) take
/// their rows in one order, whatever order their batches hold them in and whatever the
/// database's collation, so they never wait for each other in a circle: PostgreSQL would break
/// the circle by failing one of them after its `deadlock_timeout`. In each test a third
/// transaction holds a row until both batches wait for it, so that, were the rows taken in the
/// batches' order, they would deadlock every time. SQLite has one writer at a time, so there the
/// question does not arise.
mod postgres_lock_order {
    use payments_domain::{Destination, Payout, PayoutRequest, Refund};
    use payments_storage::PayoutReservation;

    use super::*;

    const PAYOUTS_CREATE: &str = "payouts.create";

    /// One batch refunds two charges in the order of their ids, the other in the opposite
    /// order, and waits first, for the second charge: written in the order given, it would
    /// then hold the second charge while the other held the first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_batches_refunding_the_same_charges_in_opposite_orders_never_deadlock() {
        let db = test_db(Backend::Postgres).await;
        let mut charges = [
            charged(&db, "acme", "first", Currency::Usd).await,
            charged(&db, "acme", "second", Currency::Usd).await,
        ];
        charges.sort_by_key(|charge| charge.as_uuid());
        let [first, second] = charges;
        let in_order = vec![
            refunded(&db, "acme", "in-order-first", first).await,
            refunded(&db, "acme", "in-order-second", second).await,
        ];
        let opposite = vec![
            refunded(&db, "acme", "opposite-second", second).await,
            refunded(&db, "acme", "opposite-first", first).await,
        ];
        let (in_order_transaction, _) = begun_over(&db, &in_order[0]).await;
        let (opposite_transaction, _) = begun_over(&db, &opposite[0]).await;

        let mut holder = db.raw.begin().await.expect("begin");
        sqlx::query("SELECT 1 FROM charges WHERE id = CAST($1 AS uuid) FOR UPDATE")
            .bind(second.as_uuid().to_string())
            .execute(&mut *holder)
            .await
            .expect("hold the second charge");
        let opposite = refunds_in(&db, opposite_transaction, opposite);
        waiting_for_locks(&db, 1).await;
        let in_order = refunds_in(&db, in_order_transaction, in_order);
        waiting_for_locks(&db, 2).await;
        holder.rollback().await.expect("let go");

        let opposite = opposite.await.expect("join");
        opposite.expect("the batch in the opposite order");
        in_order.await.expect("join").expect("the batch in order");
        let refunded: Vec<i64> =
            sqlx::query_scalar("SELECT amount_refunded FROM charges ORDER BY id")
                .fetch_all(&db.raw)
                .await
                .expect("refunded");
        assert_eq!(refunded, [20, 20], "each charge, refunded twice by 10");
        assert_eq!(db.count("ledger_transactions").await, 2 + 4);
        assert_balances_kept(&db).await;
    }

    /// One batch pays a tenant out in dollars and then euros, the other in euros and then
    /// dollars, and waits first, for the euros; both picked the same part of each balance.
    /// Written in the order given, the first would hold the dollars that the other needs next.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_batches_paying_one_tenant_out_in_two_currencies_in_opposite_orders_never_deadlock()
    {
        let db = test_db(Backend::Postgres).await;
        charged(&db, "acme", "dollars", Currency::Usd).await;
        charged(&db, "acme", "euros", Currency::Eur).await;
        let dollars_then_euros = vec![
            paid(&db, "usd-then-eur-1", Currency::Usd).await,
            paid(&db, "usd-then-eur-2", Currency::Eur).await,
        ];
        let euros_then_dollars = vec![
            paid(&db, "eur-then-usd-1", Currency::Eur).await,
            paid(&db, "eur-then-usd-2", Currency::Usd).await,
        ];
        let (dollars_first, part) = begun_over(&db, &dollars_then_euros[0]).await;
        let euros_first = begun_in_part(&db, &euros_then_dollars[0], part).await;

        let holder = hold_balance(&db, "acme", "EUR", part).await;
        let euros_first = payouts_in(&db, euros_first, euros_then_dollars);
        waiting_for_locks(&db, 1).await;
        let dollars_first = payouts_in(&db, dollars_first, dollars_then_euros);
        waiting_for_locks(&db, 2).await;
        holder.rollback().await.expect("let go");

        let euros_first = euros_first.await.expect("join");
        euros_first.expect("euros, then dollars");
        dollars_first
            .await
            .expect("join")
            .expect("dollars, then euros");
        let paid_out: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM ledger_transactions WHERE payout_id IS NOT NULL",
        )
        .fetch_one(&db.raw)
        .await
        .expect("payouts posted");
        assert_eq!(paid_out, 4);
        assert_balances_kept(&db).await;
    }

    /// A batch of charges of two tenants is one statement, whose trigger takes the tenants'
    /// balances in the order of their bytes, as a batch of refunds takes them, and not in the
    /// collation's: under `en`, `acme` comes before `Beta`, in bytes after it. The refunds wait
    /// first, for `Beta`'s balance; had the charges taken `acme`'s before they waited for it
    /// too, each batch would hold what the other needs next.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_charges_and_one_of_refunds_of_two_tenants_never_deadlock_in_any_collation()
    {
        let collated = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en'";
        let db = test_db_created(Backend::Postgres, collated).await;
        let acme = charged(&db, "acme", "acme-refunded", Currency::Usd).await;
        let beta = charged(&db, "Beta", "beta-refunded", Currency::Usd).await;
        let refunds = vec![
            refunded(&db, "acme", "acme-refund", acme).await,
            refunded(&db, "Beta", "beta-refund", beta).await,
        ];
        let charges = vec![
            charging(&db, "acme", "acme-charge", Currency::Usd).await,
            charging(&db, "Beta", "beta-charge", Currency::Usd).await,
        ];
        let (charges_transaction, part) = begun_over(&db, &charges[0]).await;
        let refunds_transaction = begun_in_part(&db, &refunds[0], part).await;

        let holder = hold_balance(&db, "Beta", "USD", part).await;
        let refunds = refunds_in(&db, refunds_transaction, refunds);
        waiting_for_locks(&db, 1).await;
        let store = db.store.clone();
        let charges = tokio::spawn(async move {
            let mut transaction = charges_transaction;
            let rows: Vec<&Charge> = charges.iter().map(|member| &member.rows).collect();
            store.insert_charges(&mut transaction, &rows).await?;
            end_and_commit(store.as_ref(), transaction, &charges).await
        });
        waiting_for_locks(&db, 2).await;
        holder.rollback().await.expect("let go");

        refunds.await.expect("join").expect("the refunds");
        charges.await.expect("join").expect("the charges");
        assert_eq!(db.count("charges").await, 4);
        assert_eq!(db.count("ledger_transactions").await, 2 + 2 + 2);
        assert_balances_kept(&db).await;
    }

    /// A member of a batch of finishes: its record's scope, key and fence, and its rows.
    struct Member<R> {
        scope: Scope,
        key: IdempotencyKey,
        fence: Fence,
        rows: R,
    }

    impl<R> Member<R> {
        fn owner(&self) -> Owner<'_> {
            Owner::new(&self.scope, &self.key, self.fence)
        }
    }

    /// Claims `name` for `tenant`'s `operation`.
    async fn claimed(
        db: &TestDb,
        tenant: &str,
        operation: &str,
        name: &str,
    ) -> (Scope, IdempotencyKey, Claimed) {
        let scope = Scope {
            tenant: tenant.into(),
            operation: operation.into(),
        };
        let key = key(name);
        let claimed = db.claim_owned(&scope, &key).await;
        (scope, key, claimed)
    }

    /// A charge of 100 in `currency` under `tenant`'s key `name`, claimed and not yet written.
    async fn charging(db: &TestDb, tenant: &str, name: &str, currency: Currency) -> Member<Charge> {
        let (scope, key, claimed) = claimed(db, tenant, CHARGES_CREATE, name).await;
        let rows = Charge {
            tenant: TenantId::new(tenant),
            money: Money::new(Amount::new(100).expect("amount"), currency),
            processor_charge_id: format!("sim_{name}"),
            ..charge_for(&claimed)
        };
        let fence = claimed.fence();
        Member {
            scope,
            key,
            fence,
            rows,
        }
    }

    /// A charge of 100 in `currency` under `tenant`'s key `name`, finished alone.
    async fn charged(db: &TestDb, tenant: &str, name: &str, currency: Currency) -> ChargeId {
        let charge = charging(db, tenant, name, currency).await;
        let done = db
            .store
            .finish_charge(charge.owner(), &charge.rows, &response("charge"))
            .await
            .expect("finish the charge");
        assert!(matches!(done, Completion::Stored { .. }));
        charge.rows.id
    }

    /// A refund of 10 of `charge` under `tenant`'s key `name`, reserved and succeeded at the
    /// processor, not yet written.
    async fn refunded(db: &TestDb, tenant: &str, name: &str, charge: ChargeId) -> Member<Refund> {
        let (scope, key, claimed) = claimed(db, tenant, REFUNDS_CREATE, name).await;
        let owner = Owner::new(&scope, &key, claimed.fence());
        let reservation = db
            .store
            .reserve_refund(owner, &refund_of(charge, Some(10)), created_at())
            .await
            .expect("reserve")
            .expect("the claim's own record");
        let rows = reserved(reservation).succeeded(format!("re_sim_{name}"));
        let fence = claimed.fence();
        Member {
            scope,
            key,
            fence,
            rows,
        }
    }

    /// A payout of 10 in `currency` under `acme`'s key `name`, reserved and paid at the
    /// processor, not yet written.
    async fn paid(db: &TestDb, name: &str, currency: Currency) -> Member<Payout> {
        let (scope, key, claimed) = claimed(db, "acme", PAYOUTS_CREATE, name).await;
        let owner = Owner::new(&scope, &key, claimed.fence());
        let request = PayoutRequest {
            money: Money::new(Amount::new(10).expect("amount"), currency),
            destination: Destination::new("ba_lock_order").expect("destination"),
            description: None,
        };
        let mut transaction = db
            .records
            .begin(owner, Begin::HOLDING)
            .await
            .expect("begin")
            .expect("own");
        let reservation = db
            .store
            .reserve_payout(&mut transaction, owner, &request, created_at())
            .await
            .expect("reserve");
        db.records.commit(transaction).await.expect("commit");
        let PayoutReservation::Reserved(payout) = reservation else {
            panic!("expected a reservation, got {reservation:?}");
        };
        let rows = payout.paid(format!("po_sim_{name}"));
        let fence = claimed.fence();
        Member {
            scope,
            key,
            fence,
            rows,
        }
    }

    /// A transaction begun to end `member`'s record, as a batch of finishes begins, and the part
    /// of the ledger's balances it writes to (its id modulo 64).
    async fn begun_over<R>(db: &TestDb, member: &Member<R>) -> (Transaction, i64) {
        let begun = db.records.begin(member.owner(), Begin::ENDING).await;
        let mut transaction = begun.expect("begin").expect("own");
        let payments_idempotency_sql::Connection::Postgres(connection) = transaction.connection()
        else {
            unreachable!("a PostgreSQL store")
        };
        let part = sqlx::query_scalar("SELECT txid_current() % 64")
            .fetch_one(connection)
            .await
            .expect("part");
        (transaction, part)
    }

    /// A transaction begun as [`begun_over`] begins one, in `part`: each try that picked
    /// another part is rolled back, and the next one takes another id.
    async fn begun_in_part<R>(db: &TestDb, member: &Member<R>, part: i64) -> Transaction {
        for _ in 0..10_000 {
            let (transaction, its_part) = begun_over(db, member).await;
            if its_part == part {
                return transaction;
            }
        }
        panic!("no transaction in part {part}");
    }

    /// Holds the part `part` of `tenant`'s `customer_payments` balance in `currency`, in a
    /// transaction of its own, until it is rolled back. The row exists before it is held, so
    /// that the transactions that wait for it take it in turn.
    async fn hold_balance(
        db: &TestDb,
        tenant: &str,
        currency: &str,
        part: i64,
    ) -> sqlx::Transaction<'static, sqlx::Any> {
        sqlx::query(
            "INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)
             VALUES ($1, 'customer_payments', $2, $3, 0) ON CONFLICT DO NOTHING",
        )
        .bind(tenant)
        .bind(currency)
        .bind(part)
        .execute(&db.raw)
        .await
        .expect("the balance's part");
        let mut holder = db.raw.begin().await.expect("begin");
        sqlx::query(
            "SELECT 1 FROM ledger_balances
             WHERE tenant_id = $1 AND account = 'customer_payments' AND currency = $2
               AND part = $3
             FOR UPDATE",
        )
        .bind(tenant)
        .bind(currency)
        .bind(part)
        .execute(&mut *holder)
        .await
        .expect("hold the balance");
        holder
    }

    type Written = tokio::task::JoinHandle<Result<(), Failure>>;

    /// The refunds written together in `transaction`, in a task of their own, as a batch of
    /// finishes writes them: their rows, their records' ends, one commit.
    fn refunds_in(
        db: &TestDb,
        mut transaction: Transaction,
        batch: Vec<Member<Refund>>,
    ) -> Written {
        let store = db.store.clone();
        tokio::spawn(async move {
            let refunds: Vec<&Refund> = batch.iter().map(|member| &member.rows).collect();
            store.finish_refunds(&mut transaction, &refunds).await?;
            end_and_commit(store.as_ref(), transaction, &batch).await
        })
    }

    /// The payouts written together in `transaction`, as [`refunds_in`] writes refunds.
    fn payouts_in(
        db: &TestDb,
        mut transaction: Transaction,
        batch: Vec<Member<Payout>>,
    ) -> Written {
        let store = db.store.clone();
        tokio::spawn(async move {
            let payouts: Vec<&Payout> = batch.iter().map(|member| &member.rows).collect();
            store.finish_payouts(&mut transaction, &payouts).await?;
            end_and_commit(store.as_ref(), transaction, &batch).await
        })
    }

    /// Each member's record ended with its answer in `transaction`, then one commit.
    async fn end_and_commit<R>(
        store: &dyn Store,
        mut transaction: Transaction,
        batch: &[Member<R>],
    ) -> Result<(), Failure> {
        let records = store.records();
        for member in batch {
            let end = End::Made(&response("201"));
            let completion = records.end(&mut transaction, member.owner(), end).await?;
            assert!(
                matches!(completion, Completion::Stored { .. }),
                "{completion:?}"
            );
        }
        records.commit(transaction).await?;
        Ok(())
    }

    /// Waits until `count` of the database's transactions wait for a lock.
    async fn waiting_for_locks(db: &TestDb, count: i64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&db.raw)
            .await
            .expect("waiting");
            if waiting == count {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{waiting} transactions wait for a lock, not {count}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The balances the database keeps are the sums of the ledger's entries.
    async fn assert_balances_kept(db: &TestDb) {
        let sums = async |table: &str| -> Vec<(String, String, String, i64)> {
            sqlx::query_as(&format!(
                "SELECT tenant_id, account, currency, CAST(sum(amount) AS BIGINT) FROM {table}
                 GROUP BY tenant_id, account, currency HAVING sum(amount) <> 0
                 ORDER BY tenant_id, account, currency"
            ))
            .fetch_all(&db.raw)
            .await
            .expect(table)
        };
        let kept = sums("ledger_balances").await;
        assert!(!kept.is_empty());
        assert_eq!(kept, sums("ledger_entries").await);
    }
}

/// The floors exist only with the `bench` feature.
#[cfg(feature = "bench")]
mod floors {
    use payments_idempotency::RecordState;

    use super::*;

    /// The bench floors write and read the rows the protocol does: a pending record of attempt 1
    /// that the service's own finish completes, read back whole by its key.
    async fn the_floors_insert_a_record_the_finish_completes_and_read_it_back(backend: Backend) {
        let db = test_db(backend).await;
        let (s, k) = (scope(), key("floor"));
        assert!(
            db.records
                .find_record(&s, &k)
                .await
                .expect("read")
                .is_none()
        );
        let resource_id = uuid::Uuid::new_v4();
        let fence = db
            .store
            .floors()
            .insert_pending_unguarded(&s, &k, &fingerprint(100), b"{}", resource_id)
            .await
            .expect("insert");
        assert_eq!((fence.attempt, fence.generation), (Attempt(1), resource_id));
        let pending = db.record(&s, &k).await;
        assert_eq!(
            (pending.state, pending.fingerprint, pending.response),
            (RecordState::Pending, fingerprint(100), None)
        );
        let charge = Charge {
            id: ChargeId::from_uuid(resource_id),
            tenant: TenantId::new("acme"),
            money: Money::new(Amount::new(100).expect("amount"), Currency::Usd),
            source: PaymentSource::new("tok_visa").expect("source"),
            description: None,
            processor_charge_id: "sim_floor".into(),
            created_at: Utc::now(),
            amount_refunded: 0,
            capture: payments_domain::Capture::Automatic,
        };
        let done = db
            .store
            .finish_charge(Owner::new(&s, &k, fence), &charge, &response("floor"))
            .await
            .expect("finish");
        assert!(matches!(done, Completion::Stored { .. }));
        let completed = db.record(&s, &k).await;
        assert_eq!(completed.state, RecordState::Completed);
        assert_eq!(completed.response.expect("response").body, b"floor");
    }

    on_every_backend!(the_floors_insert_a_record_the_finish_completes_and_read_it_back);
}
