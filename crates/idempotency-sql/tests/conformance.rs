//! The record-store port's conformance suite, and its batches', against each backend's own
//! store (`PgRecords`, `SqliteRecords`) and against `SqlRecords`, which wraps either, each
//! check on a fresh database with the records table of `schema/`.

mod common;

use common::on;

mod postgres {
    payments_idempotency::record_store_conformance!(super::common::postgres_store());
    payments_idempotency::record_batches_conformance!(super::common::postgres_store());
}

mod sqlite {
    payments_idempotency::record_store_conformance!(super::common::sqlite_store());
    payments_idempotency::record_batches_conformance!(super::common::sqlite_store());
}

mod either_on_postgres {
    payments_idempotency::record_store_conformance!(super::on(
        payments_idempotency_sql::Backend::Postgres
    ));
    payments_idempotency::record_batches_conformance!(super::on(
        payments_idempotency_sql::Backend::Postgres
    ));
}

mod either_on_sqlite {
    payments_idempotency::record_store_conformance!(super::on(
        payments_idempotency_sql::Backend::Sqlite
    ));
    payments_idempotency::record_batches_conformance!(super::on(
        payments_idempotency_sql::Backend::Sqlite
    ));
}
