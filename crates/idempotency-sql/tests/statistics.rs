//! The records table's statistics follow its growth on PostgreSQL: `refresh_statistics`
//! analyzes the table once more of its rows changed since it was last analyzed than that
//! analyze counted (and at least 1,000), and not before, nor for a role that may not analyze
//! it. Plans made over the statistics of a
//! new table's first rows would otherwise read the whole table for every claim batch as it
//! grows (docs/BENCHMARKS.md, "Plans over a growing table").

mod common;

use std::time::Duration;

use payments_idempotency::IdempotencyPolicy;
use payments_idempotency_sql::postgres::{PgRecords, connect_lazy};
use payments_idempotency_sql::{Backend, PoolSettings, SqlRecords};
use sqlx::PgConnection;

/// Inserts `n` completed records after those already there, and makes this connection's
/// counts of them reach the statistics system before it answers (they would otherwise wait
/// up to a second, or until the connection is idle).
async fn insert_records(connection: &mut PgConnection, n: i64) {
    sqlx::query(
        "INSERT INTO idempotency_records
             (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point,
              attempts, resource_id, processor_key, expires_at, response_status, response_body,
              response_schema_version)
         SELECT 'acme', 'checks.create', 'key-' || (existing.n + g), decode(repeat('00', 32), 'hex'),
                'completed', 'finished', 1, gen_random_uuid(), 'p-' || (existing.n + g),
                now() + interval '1 day', 201, '\\x7b7d', 1
         FROM (SELECT count(*) AS n FROM idempotency_records) existing, generate_series(1, $1) g",
    )
    .bind(n)
    .execute(&mut *connection)
    .await
    .unwrap_or_else(|e| panic!("insert {n} records: {e}"));
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *connection)
        .await
        .unwrap_or_else(|e| panic!("pg_stat_force_next_flush: {e}"));
}

/// How many rows the last analyze of the records table counted (-1: never analyzed).
async fn counted_rows(connection: &mut PgConnection) -> f32 {
    let (counted,): (f32,) = sqlx::query_as(
        "SELECT reltuples FROM pg_class WHERE oid = 'idempotency_records'::regclass",
    )
    .fetch_one(&mut *connection)
    .await
    .unwrap_or_else(|e| panic!("pg_class: {e}"));
    counted
}

async fn refresh(records: &SqlRecords) -> bool {
    records
        .refresh_statistics()
        .await
        .unwrap_or_else(|e| panic!("refresh_statistics: {e}"))
}

#[tokio::test]
async fn the_records_table_is_analyzed_each_time_it_outgrows_its_last_analyze() {
    let fresh = common::on(Backend::Postgres).await;
    let records = &fresh.records;
    let SqlRecords::Postgres(postgres) = records else {
        panic!("PostgreSQL's records");
    };
    let mut own = postgres
        .pool()
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("a connection: {e}"));

    insert_records(&mut own, 999).await;
    assert!(
        !refresh(records).await,
        "999 changed rows: too few to analyze"
    );
    assert!(counted_rows(&mut own).await < 0.0, "never analyzed yet");

    insert_records(&mut own, 1).await;
    assert!(refresh(records).await, "1,000 changed rows, never analyzed");
    assert!((counted_rows(&mut own).await - 1_000.0).abs() < 0.5);
    assert!(!refresh(records).await, "nothing changed since");

    insert_records(&mut own, 999).await;
    assert!(
        !refresh(records).await,
        "999 changed rows against 1,000 counted"
    );
    insert_records(&mut own, 1).await;
    assert!(
        refresh(records).await,
        "1,000 changed rows against 1,000 counted"
    );
    assert!((counted_rows(&mut own).await - 2_000.0).abs() < 0.5);

    insert_records(&mut own, 1_500).await;
    assert!(
        !refresh(records).await,
        "1,500 changed rows against 2,000 counted"
    );
    insert_records(&mut own, 500).await;
    assert!(
        refresh(records).await,
        "2,000 changed rows against 2,000 counted"
    );
    assert!((counted_rows(&mut own).await - 4_000.0).abs() < 0.5);
}

#[tokio::test]
async fn a_role_that_may_not_analyze_the_table_leaves_it_to_autovacuum() {
    let fresh = common::on(Backend::Postgres).await;
    let SqlRecords::Postgres(owner) = &fresh.records else {
        panic!("PostgreSQL's records");
    };
    let mut own = owner
        .pool()
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("a connection: {e}"));
    let role = format!("records_reader_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE ROLE {role} LOGIN"))
        .execute(&mut *own)
        .await
        .unwrap_or_else(|e| panic!("create role {role}: {e}"));
    let settings = PoolSettings {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(30),
        lock_timeout: Duration::from_secs(30),
        idle_in_transaction_timeout: Duration::from_secs(60),
    };
    let options = owner
        .pool()
        .connect_options()
        .as_ref()
        .clone()
        .username(&role);
    let reader_pool = connect_lazy(options, &settings);
    let reader = SqlRecords::Postgres(PgRecords::new(
        reader_pool.clone(),
        &settings,
        IdempotencyPolicy::default(),
    ));

    insert_records(&mut own, 1_000).await;
    assert!(!refresh(&reader).await, "not the table's owner");
    assert!(
        counted_rows(&mut own).await < 0.0,
        "not analyzed by the reader"
    );
    assert!(refresh(&fresh.records).await, "the owner analyzes it");

    reader_pool.close().await;
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&mut *own)
        .await
        .unwrap_or_else(|e| panic!("drop role {role}: {e}"));
}

#[tokio::test]
async fn sqlite_has_nothing_to_analyze() {
    let fresh = common::on(Backend::Sqlite).await;
    assert!(!refresh(&fresh.records).await);
}
