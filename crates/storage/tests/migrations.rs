//! The refunds migration on a database that already holds charges: every charge, ledger
//! transaction and entry is kept, and the rules that change (a charge is posted once, a refund
//! is posted once, refunds never exceed their charge) hold on the rows that were there before.
//! On SQLite the migration rebuilds `ledger_transactions`, whose entries point at it. The
//! ledger's balances, kept since a later migration, start from the entries already there.

use std::borrow::Cow;
use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{AnyPool, Connection, PgConnection};
use uuid::Uuid;

/// The first migration that knows refunds.
const REFUNDS: i64 = 20261201000001;

/// `all` without the refunds migration and what came after it.
fn before_refunds(all: &Migrator) -> Migrator {
    Migrator {
        migrations: Cow::Owned(
            all.iter()
                .filter(|m| m.version < REFUNDS)
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

#[tokio::test]
async fn a_sqlite_database_keeps_its_charges_and_ledger_through_the_refunds_migration() {
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
    let all = sqlx::migrate!("../../migrations/sqlite");
    before_refunds(&all)
        .run(&pool)
        .await
        .expect("migrations before refunds");
    let any = AnyPool::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("any pool");
    let charge = charge_before_refunds(&any, &SQLITE).await;

    all.run(&pool).await.expect("the refunds migration");
    let broken: Vec<(String, i64, String, i64)> = sqlx::query_as("PRAGMA foreign_key_check")
        .fetch_all(&pool)
        .await
        .expect("foreign key check");
    assert!(broken.is_empty(), "{broken:?}");
    assert_kept_and_guarded(&any, charge, &SQLITE).await;
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
    before_refunds(&all)
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
