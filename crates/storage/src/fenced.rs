//! The fenced writes of the attempt that owns a record, written once for both backends.
//!
//! Every statement here is the same SQL on PostgreSQL and SQLite but for the database's clock,
//! which each backend supplies through [`Dialect`]. The store runs them on its write path
//! (`SqlStore::write_one`: PostgreSQL's pool, SQLite's write transaction) and reads the
//! outcome with [`Finish::from_rows`] or [`Completion::from_expiry`].
//!
//! [`Finish::from_rows`]: crate::model::Finish::from_rows
//! [`Completion::from_expiry`]: crate::model::Completion::from_expiry

use std::time::Duration;

use payments_idempotency::{IdempotencyKey, Scope, StoredResponse};

use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::model::Owner;
use crate::rows::{headers_to_json, stored_status};

/// `UPDATE idempotency_records SET recovery_point = 'charged' ..`: the processor confirmed
/// the charge, so that a takeover resumes from here without calling it again.
pub(crate) fn record_effect<'a, DB: Dialect>(
    owner: Owner<'a>,
    effect_id: &'a str,
) -> Statement<'a, DB> {
    let mut sql =
        Statement::new("UPDATE idempotency_records SET recovery_point = 'charged', effect_id = ");
    sql.value(effect_id);
    push_touched_where_fenced(&mut sql, owner);
    sql
}

/// Fails the record after the processor tombstoned its key, `RETURNING expires_at`. Its
/// retention counts from now. A record that holds an effect id is never failed: the
/// charge must reach the ledger.
pub(crate) fn fail<'a, DB: Dialect>(owner: Owner<'a>, ttl: Duration) -> Statement<'a, DB> {
    let mut sql = Statement::new(
        "UPDATE idempotency_records SET state = 'failed', locked_until = NULL, expires_at = ",
    );
    DB::push_now_plus(&mut sql, ttl);
    push_touched_where_fenced(&mut sql, owner);
    sql.push(" AND effect_id IS NULL RETURNING expires_at");
    sql
}

/// Reads the record `owner` holds under a row lock, fenced: on the caller's transaction, it
/// holds the record until the commit, so that no takeover or completer ends this generation
/// meanwhile, and it finds no row once another attempt or generation owns the record. A lock,
/// not a write: the record is written once more, by its end. (SQLite's write transaction
/// holds the whole database already.)
pub(crate) fn lock<'a, DB: Dialect>(owner: Owner<'a>) -> Statement<'a, DB> {
    let mut sql = Statement::new("SELECT attempts FROM idempotency_records");
    crate::claiming::push_where_key(&mut sql, owner.scope, owner.key);
    push_fence(&mut sql, owner);
    sql.push(DB::LOCK_ROW);
    sql
}

/// Gives up the lock after an unknown outcome: the record stays pending and is stale at once,
/// so the next retry resumes it, and the completer settles it once the settle grace has
/// passed. Failing it instead would leave a charge the processor did make unrecorded.
pub(crate) fn release<'a, DB: Dialect>(owner: Owner<'a>) -> Statement<'a, DB> {
    let mut sql = Statement::new("UPDATE idempotency_records SET locked_until = ");
    sql.push(DB::NOW);
    push_touched_where_fenced(&mut sql, owner);
    sql
}

/// Completes the record with `response`, `RETURNING expires_at`. Retention is counted from
/// the completion, never from the claim, so a record completed late in its life is still
/// replayed for the whole TTL.
pub(crate) fn complete<'a, DB: Dialect>(
    owner: Owner<'a>,
    response: &'a StoredResponse,
    ttl: Duration,
) -> Result<Statement<'a, DB>, StoreError> {
    let mut sql = Statement::new("");
    push_complete(&mut sql, owner, response, ttl)?;
    Ok(sql)
}

/// [`complete`] for a final answer that made nothing (a decline, a refusal): a record that
/// holds an effect id is never completed this way (no row: fenced), since its effect must
/// reach the ledger with its operation's rows. So a completed record holding an effect id
/// always has them, and the reapers judge a record by the record alone.
pub(crate) fn complete_without_effect<'a, DB: Dialect>(
    owner: Owner<'a>,
    response: &'a StoredResponse,
    ttl: Duration,
) -> Result<Statement<'a, DB>, StoreError> {
    let mut sql = Statement::new("");
    push_completion(&mut sql, owner, response, ttl)?;
    sql.push(" AND effect_id IS NULL RETURNING expires_at");
    Ok(sql)
}

/// Pushes the statement of [`complete`] into `sql`, where it can be the gate of a statement
/// of the caller's (PostgreSQL's one-statement finish).
pub(crate) fn push_complete<'a, DB: Dialect>(
    sql: &mut Statement<'a, DB>,
    owner: Owner<'a>,
    response: &'a StoredResponse,
    ttl: Duration,
) -> Result<(), StoreError> {
    push_completion(sql, owner, response, ttl)?;
    sql.push(" RETURNING expires_at");
    Ok(())
}

/// The fenced update that completes the record with `response`, without its `RETURNING`.
fn push_completion<'a, DB: Dialect>(
    sql: &mut Statement<'a, DB>,
    owner: Owner<'a>,
    response: &'a StoredResponse,
    ttl: Duration,
) -> Result<(), StoreError> {
    push_completed(sql, response, ttl)?;
    push_touched_where_fenced(sql, owner);
    Ok(())
}

/// Completes a pending record that no attempt will ever finish (one held by a processor
/// mismatch that an operator voided) with `response`, whichever attempt holds it: its
/// attempt number moves on, so an attempt still at work is fenced off and answers from the
/// record. A record holding an effect id is left alone: its effect must reach the ledger.
pub(crate) fn complete_held<'a, DB: Dialect>(
    scope: &'a Scope,
    key: &'a IdempotencyKey,
    response: &'a StoredResponse,
    ttl: Duration,
) -> Result<Statement<'a, DB>, StoreError> {
    let mut sql = Statement::new("");
    push_completed(&mut sql, response, ttl)?;
    sql.push(", attempts = attempts + 1, updated_at = ")
        .push(DB::NOW);
    crate::claiming::push_where_key(&mut sql, scope, key);
    sql.push(" AND state = 'pending' AND effect_id IS NULL");
    Ok(sql)
}

/// `UPDATE .. SET` a completed record with `response` and its expiry, without a `WHERE`.
fn push_completed<'a, DB: Dialect>(
    sql: &mut Statement<'a, DB>,
    response: &'a StoredResponse,
    ttl: Duration,
) -> Result<(), StoreError> {
    sql.push(
        "UPDATE idempotency_records SET state = 'completed', recovery_point = 'finished',
             locked_until = NULL, response_status = ",
    )
    .value(stored_status(response)?)
    .push(", response_headers = ")
    .value(headers_to_json(&response.headers))
    .push(", response_body = ")
    .value(response.body.as_slice())
    .push(", response_schema_version = ")
    .value(i64::from(response.schema_version.get()))
    .push(", expires_at = ");
    DB::push_now_plus(sql, ttl);
    Ok(())
}

/// `, updated_at = <now> WHERE <fence>`: every fenced statement matches only while the record
/// is still pending and still holds the generation (resource id) and attempt number this
/// attempt claimed with.
pub(crate) fn push_touched_where_fenced<'a, DB: Dialect>(
    sql: &mut Statement<'a, DB>,
    owner: Owner<'a>,
) {
    sql.push(", updated_at = ").push(DB::NOW);
    crate::claiming::push_where_key(sql, owner.scope, owner.key);
    push_fence(sql, owner);
}

/// ` AND <fence>`: the record is still pending and still holds the generation (resource id)
/// and attempt number this attempt claimed with.
fn push_fence<'a, DB: Dialect>(sql: &mut Statement<'a, DB>, owner: Owner<'a>) {
    sql.push(" AND attempts = ")
        .value(owner.fence.attempt.0)
        .push(" AND resource_id = ")
        .value(owner.fence.generation)
        .push(" AND state = 'pending'");
}

#[cfg(test)]
mod tests {
    use payments_idempotency::{Attempt, Fingerprint, IdempotencyPolicy};
    use serde_json::json;
    use sqlx::{Postgres, Sqlite};
    use uuid::Uuid;

    use payments_idempotency::engine::Fence;
    use payments_idempotency::{IdempotencyKey, Scope};

    use super::*;
    use crate::claiming;
    use crate::model::Generation;

    fn scope(tenant: &str) -> Scope {
        Scope {
            tenant: tenant.into(),
            operation: "charges.create".into(),
        }
    }

    fn key(name: &str) -> IdempotencyKey {
        IdempotencyKey::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn fence(attempt: i32) -> Fence {
        Fence {
            attempt: Attempt(attempt),
            generation: Uuid::new_v4(),
        }
    }

    fn response(body: &[u8]) -> StoredResponse {
        let version = payments_idempotency::SchemaVersion::new(1);
        StoredResponse::new(
            version,
            201,
            [("content-type", "application/json")],
            body.to_vec(),
        )
    }

    /// Every statement of a backend, for two different sets of values.
    fn statements<DB: Dialect>(a: &Inputs, b: &Inputs) -> Vec<(String, String)> {
        let each = |i: &Inputs| -> Vec<String> {
            let complete = complete::<DB>(i.owner(), &i.response, i.policy.ttl)
                .unwrap_or_else(|e| panic!("{e}"));
            vec![
                record_effect::<DB>(i.owner(), &i.charge_id)
                    .sql()
                    .to_owned(),
                fail::<DB>(i.owner(), i.policy.ttl).sql().to_owned(),
                release::<DB>(i.owner()).sql().to_owned(),
                lock::<DB>(i.owner()).sql().to_owned(),
                complete.sql().to_owned(),
                claiming::insert_pending::<DB>(i.claim(), &i.generation, i.policy)
                    .sql()
                    .to_owned(),
                claiming::take_over::<DB>(&i.scope, &i.key, i.policy.lock_timeout)
                    .sql()
                    .to_owned(),
                claiming::replace::<DB>(i.claim(), &i.generation, i.policy)
                    .sql()
                    .to_owned(),
                claiming::read_record::<DB>(&i.scope, &i.key, true)
                    .sql()
                    .to_owned(),
            ]
        };
        each(a).into_iter().zip(each(b)).collect()
    }

    struct Inputs {
        scope: Scope,
        key: IdempotencyKey,
        fence: Fence,
        response: StoredResponse,
        charge_id: String,
        fingerprint: Fingerprint,
        body: Vec<u8>,
        generation: Generation,
        policy: IdempotencyPolicy,
    }

    impl Inputs {
        fn owner(&self) -> Owner<'_> {
            Owner::new(&self.scope, &self.key, self.fence)
        }

        fn claim(&self) -> claiming::NewClaim<'_> {
            claiming::NewClaim {
                scope: &self.scope,
                key: &self.key,
                fingerprint: &self.fingerprint,
                request_body: &self.body,
            }
        }
    }

    fn inputs(tenant: &str, name: &str, attempt: i32, ttl_secs: u64) -> Inputs {
        let policy = IdempotencyPolicy::new(
            Duration::from_secs(ttl_secs),
            Duration::from_secs(30),
            Duration::from_secs(604_800),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Inputs {
            scope: scope(tenant),
            key: key(name),
            fence: fence(attempt),
            response: response(name.as_bytes()),
            charge_id: format!("sim_{name}"),
            fingerprint: Fingerprint::of_json_request("POST", "/charges", &json!({ "n": name })),
            body: name.as_bytes().to_vec(),
            generation: Generation::new(),
            policy,
        }
    }

    /// The values are bound, never written into the text: each statement has one text on
    /// every call, so a connection prepares it once and then takes it from sqlx's cache (and
    /// no value can change what the statement does).
    #[test]
    fn every_statement_has_one_text_whatever_its_values() {
        let a = inputs("acme", "k1", 1, 86_400);
        let b = inputs("globex", "another-key", 7, 3_600);
        for (first, second) in statements::<Postgres>(&a, &b)
            .into_iter()
            .chain(statements::<Sqlite>(&a, &b))
        {
            assert_eq!(first, second);
            assert!(!first.contains("acme") && !first.contains("k1"), "{first}");
        }
    }
}
