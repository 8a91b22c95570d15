//! The statements of a claim, written once for both backends: the insert of a fresh key, the
//! read of a record with the database's clock, the takeover of an abandoned record and the
//! replacement of an expired or failed one. Only the clock and the row lock differ between
//! the backends ([`Dialect`]); each backend runs these in its own claim, under its own lock
//! (PostgreSQL: a short transaction and `FOR UPDATE`; SQLite: `BEGIN IMMEDIATE`).

use std::time::Duration;

use crate::dialect::{Dialect, Statement};
use crate::model::Generation;
use payments_idempotency::{Fingerprint, IdempotencyKey, IdempotencyPolicy, Scope};

/// A claim of `key` for a request: its scope, its fingerprint, and the canonical body stored
/// with the record for the completer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewClaim<'a> {
    pub scope: &'a Scope,
    pub key: &'a IdempotencyKey,
    pub fingerprint: &'a Fingerprint,
    pub request_body: &'a [u8],
}

/// `INSERT .. ON CONFLICT DO NOTHING RETURNING attempts`: a pending record at `started`,
/// attempt 1, locked for the lock timeout. The primary key decides between concurrent
/// duplicates: of any number of them, exactly one inserts, and the others get no row.
pub(crate) fn insert_pending<'a, DB: Dialect>(
    claim: NewClaim<'a>,
    generation: &'a Generation,
    policy: IdempotencyPolicy,
) -> Statement<'a, DB> {
    let mut sql = insert_record(claim, generation, policy);
    sql.push(" ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING RETURNING attempts");
    sql
}

/// `INSERT INTO idempotency_records .. VALUES (..)`: a fresh pending record, with no conflict
/// handling (the bench floor inserts it on its own, for a key it knows is new).
pub(crate) fn insert_record<'a, DB: Dialect>(
    claim: NewClaim<'a>,
    generation: &'a Generation,
    policy: IdempotencyPolicy,
) -> Statement<'a, DB> {
    let mut sql = Statement::new(
        "INSERT INTO idempotency_records
             (tenant_id, operation, idempotency_key, fingerprint, request_version, state,
              recovery_point, locked_until, attempts, resource_id, processor_key, created_at,
              expires_at, updated_at, request_body)
         VALUES (",
    );
    sql.value(claim.scope.tenant.as_str())
        .push(", ")
        .value(claim.scope.operation.as_str())
        .push(", ")
        .value(claim.key.as_str())
        .push(", ")
        .value(claim.fingerprint.as_bytes().as_slice())
        .push(", ")
        .value(request_version(claim.fingerprint))
        .push(", 'pending', 'started', ");
    DB::push_now_plus(&mut sql, policy.lock_timeout);
    sql.push(", 1, ")
        .value(generation.resource_id)
        .push(", ")
        .value(generation.processor_key.as_str())
        .push(", ")
        .push(DB::NOW)
        .push(", ");
    // Provisional: a pending record never expires; its completion sets the real expiry.
    DB::push_now_plus(&mut sql, policy.ttl);
    sql.push(", ")
        .push(DB::NOW)
        .push(", ")
        .value(claim.request_body)
        .push(")");
    sql
}

/// The record under `key` with the database's clock (`db_now`): all instances judge lock
/// expiry by the same clock, never their own. With `lock`, the row is read under the
/// backend's row lock, where it has one ([`Dialect::LOCK_ROW`]).
pub(crate) fn read_record<'a, DB: Dialect>(
    scope: &'a Scope,
    key: &'a IdempotencyKey,
    lock: bool,
) -> Statement<'a, DB> {
    let mut sql = Statement::new("SELECT r.*, ");
    sql.push(DB::NOW)
        .push(" AS db_now FROM idempotency_records r");
    push_where_key(&mut sql, scope, key);
    if lock {
        sql.push(DB::LOCK_ROW);
    }
    sql
}

/// Gives a stale or failed record to this attempt, keeping its resource id, processor key and
/// recovery point: the attempt resumes the same request, it does not start a new one.
/// `attempts + 1` fences off the attempt it takes over.
pub(crate) fn take_over<'a, DB: Dialect>(
    scope: &'a Scope,
    key: &'a IdempotencyKey,
    lock_timeout: Duration,
) -> Statement<'a, DB> {
    let mut sql = Statement::new(
        "UPDATE idempotency_records SET state = 'pending', attempts = attempts + 1, locked_until = ",
    );
    DB::push_now_plus(&mut sql, lock_timeout);
    sql.push(", updated_at = ").push(DB::NOW);
    push_where_key(&mut sql, scope, key);
    sql.push(" RETURNING attempts, resource_id, processor_key");
    sql
}

/// Reuses an expired or failed record's row for a new generation: a new resource id and
/// processor key (a failed record's old key is tombstoned at the processor), `attempts` still
/// counting. A straggler of the old generation can never pass the new one's fence.
pub(crate) fn replace<'a, DB: Dialect>(
    claim: NewClaim<'a>,
    generation: &'a Generation,
    policy: IdempotencyPolicy,
) -> Statement<'a, DB> {
    let mut sql = Statement::new("UPDATE idempotency_records SET fingerprint = ");
    sql.value(claim.fingerprint.as_bytes().as_slice())
        .push(", request_version = ")
        .value(request_version(claim.fingerprint))
        .push(
            ", state = 'pending', recovery_point = 'started', attempts = attempts + 1,
             locked_until = ",
        );
    DB::push_now_plus(&mut sql, policy.lock_timeout);
    sql.push(", resource_id = ")
        .value(generation.resource_id)
        .push(", processor_key = ")
        .value(generation.processor_key.as_str())
        .push(
            ", effect_id = NULL, response_status = NULL, response_headers = NULL,
             response_body = NULL, response_schema_version = NULL, created_at = ",
        )
        .push(DB::NOW)
        .push(", expires_at = ");
    DB::push_now_plus(&mut sql, policy.ttl);
    sql.push(", updated_at = ")
        .push(DB::NOW)
        .push(", request_body = ")
        .value(claim.request_body);
    push_where_key(&mut sql, claim.scope, claim.key);
    sql.push(" RETURNING attempts");
    sql
}

/// The request version a fingerprint was made under, as the column holds it.
fn request_version(fingerprint: &Fingerprint) -> i64 {
    i64::from(fingerprint.request_version())
}

/// ` WHERE <the record's primary key>`.
pub(crate) fn push_where_key<'a, DB: Dialect>(
    sql: &mut Statement<'a, DB>,
    scope: &'a Scope,
    key: &'a IdempotencyKey,
) {
    sql.push(" WHERE tenant_id = ")
        .value(scope.tenant.as_str())
        .push(" AND operation = ")
        .value(scope.operation.as_str())
        .push(" AND idempotency_key = ")
        .value(key.as_str());
}
