//! The record-store port's conformance suite, and its batches', against `SqlRecords` on
//! PostgreSQL and on SQLite, each check on a fresh database with the records table of
//! `schema/`.

mod common;

use common::on;

mod postgres {
    payments_idempotency::record_store_conformance!(super::on(
        payments_idempotency_sql::Backend::Postgres
    ));
    payments_idempotency::record_batches_conformance!(super::on(
        payments_idempotency_sql::Backend::Postgres
    ));
}

mod sqlite {
    payments_idempotency::record_store_conformance!(super::on(
        payments_idempotency_sql::Backend::Sqlite
    ));
    payments_idempotency::record_batches_conformance!(super::on(
        payments_idempotency_sql::Backend::Sqlite
    ));
}
