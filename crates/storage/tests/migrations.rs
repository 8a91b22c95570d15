//! Migrations that rebuild what a database already holds.
//!
//! The refunds migration on a database that already holds charges: every charge, ledger
//! transaction and entry is kept, and the rules that change (a charge is posted once, a refund
//! is posted once, refunds never exceed their charge) hold on the rows that were there before.
//! On SQLite the migration rebuilds `ledger_transactions`, whose entries point at it. The
//! ledger's balances, kept since a later migration, start from the entries already there.
//!
//! The migration that puts the ends of holds in the books, on a database that already holds a
//! resolved reconciliation exception: the exception and its resolution are kept (SQLite rebuilds
//! both), and an exception may now be of a capture or a void, and still of nothing else.

use std::borrow::Cow;
use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{AnyPool, Connection, PgConnection};
use uuid::Uuid;

/// The first migration that knows refunds.
const REFUNDS: i64 = 20261201000001;

/// The first migration that puts what ended a hold in the books.
const HOLD_ENDS: i64 = 20261211000001;

/// `all` without the migration `version` and what came after it.
fn before(all: &Migrator, version: i64) -> Migrator {
    Migrator {
        migrations: Cow::Owned(
            all.iter()
                .filter(|m| m.version < version)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    }
}

/// How each backend's SQL spells what the test writes.
struct Spelling {
    uuid: fn(Uuid) -> String,
    now: &'static str,
    /// SQLite seals a ledger transaction when its row goes in, so its entries go first there;
    /// PostgreSQL checks the entries' foreign key at once, so the row goes first.
    entries_first: bool,
}

const SQLITE: Spelling = Spelling {
    uuid: |id| format!("X'{}'", id.simple()),
    now: "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    entries_first: true,
};

const POSTGRES: Spelling = Spelling {
    uuid: |id| format!("'{id}'::uuid"),
    now: "now()",
    entries_first: false,
};

/// A charge of 1,000 with its balanced ledger transaction, written as the code before
/// refunds wrote it.
async fn charge_before_refunds(db: &AnyPool, sql: &Spelling) -> Uuid {
    let (uuid, now) = (sql.uuid, sql.now);
    let (charge, transaction) = (Uuid::new_v4(), Uuid::new_v4());
    let statements = [
        format!(
            "INSERT INTO charges (id, tenant_id, amount, currency, source, status,
                                  processor_charge_id, created_at)
             VALUES ({}, 'acme', 1000, 'USD', 'tok_visa', 'succeeded', 'sim_1', {now})",
            uuid(charge)
        ),
        format!(
            "INSERT INTO ledger_transactions (id, tenant_id, charge_id, created_at)
             VALUES ({}, 'acme', {}, {now})",
            uuid(transaction),
            uuid(charge)
        ),
        format!(
            "INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
             VALUES ({t}, 1, 'acme', 'processor_receivable', 'USD', 1000),
                    ({t}, 2, 'acme', 'customer_payments', 'USD', -1000)",
            t = uuid(transaction)
        ),
    ];
    let mut tx = db.begin().await.expect("begin");
    let order: &[usize] = if sql.entries_first {
        &[0, 2, 1]
    } else {
        &[0, 1, 2]
    };
    for &i in order {
        sqlx::query(&statements[i])
            .execute(&mut *tx)
            .await
            .expect("write a charge");
    }
    tx.commit().await.expect("commit");
    charge
}

/// What must hold once the refunds migration ran over `charge`.
async fn assert_kept_and_guarded(db: &AnyPool, charge: Uuid, sql: &Spelling) {
    let (uuid, now) = (sql.uuid, sql.now);
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM charges), (SELECT count(*) FROM ledger_transactions),
                (SELECT count(*) FROM ledger_entries)",
    )
    .fetch_one(db)
    .await
    .expect("counts");
    assert_eq!(counts, (1, 1, 2), "every row is kept");
    let amounts: (i64, i64) =
        sqlx::query_as("SELECT amount_refunded, amount_reserved FROM charges")
            .fetch_one(db)
            .await
            .expect("amounts");
    assert_eq!(amounts, (0, 0));
    let balances: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT tenant_id, account, currency, CAST(sum(amount) AS BIGINT) FROM ledger_balances
         GROUP BY tenant_id, account, currency ORDER BY account",
    )
    .fetch_all(db)
    .await
    .expect("balances");
    let balance = |account: &str, amount| ("acme".into(), account.into(), "USD".into(), amount);
    assert_eq!(
        balances,
        [
            balance("customer_payments", -1000),
            balance("processor_receivable", 1000)
        ],
        "the ledger's balances start from the entries already there"
    );

    let posting_again = format!(
        "INSERT INTO ledger_transactions (id, tenant_id, charge_id, created_at)
         VALUES ({}, 'acme', {}, {now})",
        uuid(Uuid::new_v4()),
        uuid(charge)
    );
    let refused = sqlx::query(&posting_again).execute(db).await;
    assert!(refused.is_err(), "a charge is still posted once");

    let over = sqlx::query("UPDATE charges SET amount_reserved = 1001")
        .execute(db)
        .await;
    assert!(over.is_err(), "no refund reserves more than its charge");
}

/// A fresh SQLite database file in a directory of its own: its directory, a pool that enforces
/// foreign keys, and a pool of the `Any` driver the tests write through.
async fn sqlite_database() -> (std::path::PathBuf, sqlx::SqlitePool, AnyPool) {
    sqlx::any::install_default_drivers();
    let dir = std::env::temp_dir().join(format!("payments-migration-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("payments.db");
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", file.display()))
        .expect("url")
        .create_if_missing(true)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("open");
    let any = AnyPool::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("any pool");
    (dir, pool, any)
}

/// No row of `pool`'s database points at a row that is not there.
async fn assert_foreign_keys_hold(pool: &sqlx::SqlitePool) {
    let broken: Vec<(String, i64, String, i64)> = sqlx::query_as("PRAGMA foreign_key_check")
        .fetch_all(pool)
        .await
        .expect("foreign key check");
    assert!(broken.is_empty(), "{broken:?}");
}

#[tokio::test]
async fn a_sqlite_database_keeps_its_charges_and_ledger_through_the_refunds_migration() {
    let (dir, pool, any) = sqlite_database().await;
    let all = sqlx::migrate!("../../migrations/sqlite");
    before(&all, REFUNDS)
        .run(&pool)
        .await
        .expect("migrations before refunds");
    let charge = charge_before_refunds(&any, &SQLITE).await;

    all.run(&pool).await.expect("the refunds migration");
    assert_foreign_keys_hold(&pool).await;
    assert_kept_and_guarded(&any, charge, &SQLITE).await;
    any.close().await;
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A day's run with one exception, resolved by an operator's void, as the code before the hold
/// ends wrote them.
async fn resolved_exception_before_hold_ends(db: &AnyPool, sql: &Spelling) {
    let (uuid, now) = (sql.uuid, sql.now);
    let exception = Uuid::new_v4();
    let statements = [
        format!(
            "INSERT INTO reconciliation_runs
                 (report_date, ran_at, matched, settled, in_flight, exceptions)
             VALUES ('2026-12-01', {now}, 3, 0, 0, 1)"
        ),
        format!(
            "INSERT INTO reconciliation_exceptions
                 (id, report_date, kind, effect, processor_id, processor_key, tenant_id,
                  processor_amount, processor_currency, status, created_at)
             VALUES ({}, '2026-12-01', 'processor_only', 'charge', 'sim_1', 'key-1', 'acme',
                     700, 'USD', 'resolved', {now})",
            uuid(exception)
        ),
        format!(
            "INSERT INTO reconciliation_resolutions
                 (exception_id, action, operator, note, resolved_at, void_tenant_id,
                  void_processor_id, void_amount, void_currency)
             VALUES ({}, 'void', 'ops', 'not ours', {now}, 'acme', 're_sim_1', 700, 'USD')",
            uuid(exception)
        ),
    ];
    for statement in statements {
        sqlx::query(&statement)
            .execute(db)
            .await
            .expect("write a resolved exception");
    }
}

/// What must hold once the hold ends migration ran over `exception`.
async fn assert_exceptions_kept_and_widened(db: &AnyPool, sql: &Spelling) {
    let (uuid, now) = (sql.uuid, sql.now);
    let kept: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM reconciliation_exceptions WHERE status = 'resolved'),
                (SELECT count(*) FROM reconciliation_resolutions WHERE action = 'void'),
                (SELECT count(*) FROM books WHERE kind = 'refund' AND processor_id = 're_sim_1')",
    )
    .fetch_one(db)
    .await
    .expect("counts");
    assert_eq!(
        kept,
        (1, 1, 1),
        "the exception, its resolution, and the void in the books"
    );
    let exception_of = |effect: &str, processor_id: &str| {
        format!(
            "INSERT INTO reconciliation_exceptions
                 (id, report_date, kind, effect, processor_id, status, created_at)
             VALUES ({}, '2026-12-01', 'processor_only', '{effect}', '{processor_id}', 'open',
                     {now})",
            uuid(Uuid::new_v4())
        )
    };
    for (effect, processor_id) in [("capture", "cap_1"), ("void", "void_1")] {
        sqlx::query(&exception_of(effect, processor_id))
            .execute(db)
            .await
            .unwrap_or_else(|e| panic!("an exception of a {effect}: {e}"));
    }
    let refused = sqlx::query(&exception_of("transfer", "tr_1"))
        .execute(db)
        .await;
    assert!(refused.is_err(), "an exception is of what the books know");
}

#[tokio::test]
async fn a_sqlite_database_keeps_its_exceptions_through_the_hold_ends_migration() {
    let (dir, pool, any) = sqlite_database().await;
    let all = sqlx::migrate!("../../migrations/sqlite");
    before(&all, HOLD_ENDS)
        .run(&pool)
        .await
        .expect("migrations before the hold ends");
    resolved_exception_before_hold_ends(&any, &SQLITE).await;

    all.run(&pool).await.expect("the hold ends migration");
    assert_foreign_keys_hold(&pool).await;
    assert_exceptions_kept_and_widened(&any, &SQLITE).await;
    any.close().await;
    pool.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_postgres_database_keeps_its_charges_and_ledger_through_the_refunds_migration() {
    sqlx::any::install_default_drivers();
    let admin = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("payments_test_{}", Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(&admin)
        .await
        .expect("admin connection");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create database");
    let url = format!(
        "{}/{name}",
        admin.rsplit_once('/').expect("a database in the URL").0
    );
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let all = sqlx::migrate!("../../migrations/postgres");
    before(&all, REFUNDS)
        .run(&pool)
        .await
        .expect("migrations before refunds");
    let any = AnyPool::connect(&url).await.expect("any pool");
    let charge = charge_before_refunds(&any, &POSTGRES).await;

    all.run(&pool).await.expect("the refunds migration");
    assert_kept_and_guarded(&any, charge, &POSTGRES).await;
    any.close().await;
    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await
        .expect("drop database");
}
