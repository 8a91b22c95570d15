//! The fenced writes of the attempt that owns a record, written once for both backends.
//!
//! Every statement here is the same SQL on PostgreSQL and SQLite but for the database's clock,
//! which each backend supplies through [`Dialect`]. A backend runs the statements on its own
//! connection (PostgreSQL: the pool; SQLite: a write transaction) and reads the outcome with
//! [`Finish::from_rows`] or [`Completion::from_expiry`].
//!
//! Each fragment binds its values where it names them (`QueryBuilder`), so no statement
//! depends on parameter numbers kept in step elsewhere. The text is the same on every call,
//! so each statement is prepared once per connection and then comes from sqlx's cache.

use std::time::Duration;

use chrono::{DateTime, Utc};

use payments_idempotency::StoredResponse;
use sqlx::{Database, Encode, QueryBuilder, Type};
use uuid::Uuid;

use crate::StoreError;
use crate::model::Owner;
use crate::rows::{headers_to_json, stored_status};

/// A value a backend binds into a statement: every type the shared statements bind.
pub(crate) trait Bind<'a, T>: Database {
    fn bind(sql: &mut QueryBuilder<'a, Self>, value: T);
}

impl<'a, T, DB> Bind<'a, T> for DB
where
    DB: Database,
    T: 'a + Encode<'a, DB> + Type<DB>,
{
    fn bind(sql: &mut QueryBuilder<'a, Self>, value: T) {
        sql.push_bind(value);
    }
}

/// `QueryBuilder::push_bind` for the shared statements, which know their database only as a
/// [`Dialect`]: the dialect's [`Bind`] supertraits say what it can bind, once, instead of
/// every statement repeating the `Encode` bounds of each of its values.
pub(crate) trait PushValue<'a, DB: Database> {
    fn value<T>(&mut self, value: T) -> &mut Self
    where
        DB: Bind<'a, T>;
}

impl<'a, DB: Database> PushValue<'a, DB> for QueryBuilder<'a, DB> {
    fn value<T>(&mut self, value: T) -> &mut Self
    where
        DB: Bind<'a, T>,
    {
        DB::bind(self, value);
        self
    }
}

/// What differs between the backends in the statements they share (here, in `claiming.rs`,
/// `reading.rs` and `outbox.rs`): how the database tells the time, how a row is read under a
/// lock, and the values it binds.
pub(crate) trait Dialect:
    Database
    + for<'a> Bind<'a, &'a str>
    + for<'a> Bind<'a, Option<&'a str>>
    + for<'a> Bind<'a, &'a [u8]>
    + for<'a> Bind<'a, i16>
    + for<'a> Bind<'a, i32>
    + for<'a> Bind<'a, i64>
    + for<'a> Bind<'a, f64>
    + for<'a> Bind<'a, String>
    + for<'a> Bind<'a, Uuid>
    + for<'a> Bind<'a, serde_json::Value>
{
    /// A statement starting with `sql`.
    fn builder<'a>(sql: &str) -> QueryBuilder<'a, Self>;

    /// The database's clock, as an expression of the type of the time columns.
    const NOW: &'static str;

    /// Appended to a `SELECT` of one record to read it under a row lock.
    const LOCK_ROW: &'static str;

    /// Appended to the `SELECT` of rows a statement deletes in batches, so that the reapers of
    /// several instances take disjoint rows.
    const SKIP_LOCKED: &'static str;

    /// Pushes the database's clock plus `after`, binding what the expression needs.
    fn push_now_plus(sql: &mut QueryBuilder<'_, Self>, after: Duration);

    /// Pushes the database's clock minus `before`, binding what the expression needs.
    fn push_now_minus(sql: &mut QueryBuilder<'_, Self>, before: Duration);

    /// Binds a time the service wrote (a charge's creation), as its time columns hold it.
    fn push_time(sql: &mut QueryBuilder<'_, Self>, time: DateTime<Utc>);

    /// The seconds from the oldest `created_at` of the rows selected to now, as a double
    /// (`NULL` for no rows).
    const OLDEST_AGE_SECS: &'static str;

    /// Whether a ledger transaction's row goes in after its entries, sealing them (SQLite's
    /// balance trigger), rather than before them (PostgreSQL's immediate foreign key, with the
    /// balance checked at commit).
    const SEALS_LEDGER_LAST: bool;
}

impl Dialect for sqlx::Postgres {
    fn builder<'a>(sql: &str) -> QueryBuilder<'a, Self> {
        QueryBuilder::new(sql)
    }

    const NOW: &'static str = "now()";
    // Concurrent claims of one existing key queue here, so exactly one of them can take a
    // stale record over.
    const LOCK_ROW: &'static str = " FOR UPDATE";
    const SEALS_LEDGER_LAST: bool = false;
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const OLDEST_AGE_SECS: &'static str = "extract(epoch FROM now() - min(created_at))::float8";

    fn push_now_plus(sql: &mut QueryBuilder<'_, Self>, after: Duration) {
        // make_interval takes its seconds as a double.
        sql.push("now() + make_interval(secs => ")
            .push_bind(after.as_secs_f64())
            .push(")");
    }

    fn push_now_minus(sql: &mut QueryBuilder<'_, Self>, before: Duration) {
        sql.push("now() - make_interval(secs => ")
            .push_bind(before.as_secs_f64())
            .push(")");
    }

    fn push_time(sql: &mut QueryBuilder<'_, Self>, time: DateTime<Utc>) {
        sql.push_bind(time);
    }
}

impl Dialect for sqlx::Sqlite {
    fn builder<'a>(sql: &str) -> QueryBuilder<'a, Self> {
        QueryBuilder::new(sql)
    }

    // Every time column holds this one text format, so that text order is time order.
    const NOW: &'static str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";
    // No row locks: a claim runs in a `BEGIN IMMEDIATE` transaction, whose write lock keeps
    // every other writer out from its first statement on.
    const LOCK_ROW: &'static str = "";
    const SEALS_LEDGER_LAST: bool = true;
    // One writer at a time: the write lock keeps every other reaper out.
    const SKIP_LOCKED: &'static str = "";
    const OLDEST_AGE_SECS: &'static str =
        "(julianday('now') - julianday(min(created_at))) * 86400.0";

    fn push_now_plus(sql: &mut QueryBuilder<'_, Self>, after: Duration) {
        sql.push("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ")
            .push_bind(crate::sqlite::offset(after))
            .push(")");
    }

    fn push_now_minus(sql: &mut QueryBuilder<'_, Self>, before: Duration) {
        sql.push("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ")
            .push_bind(crate::sqlite::ago(before))
            .push(")");
    }

    fn push_time(sql: &mut QueryBuilder<'_, Self>, time: DateTime<Utc>) {
        sql.push_bind(crate::sqlite::stored_time(time));
    }
}

/// `UPDATE idempotency_records SET recovery_point = 'charged' ..`: the processor confirmed
/// the charge, so that a takeover resumes from here without calling it again.
pub(crate) fn record_effect<'a, DB: Dialect>(
    owner: Owner<'a>,
    effect_id: &'a str,
) -> QueryBuilder<'a, DB> {
    let mut sql =
        DB::builder("UPDATE idempotency_records SET recovery_point = 'charged', effect_id = ");
    sql.value(effect_id);
    push_touched_where_fenced(&mut sql, owner);
    sql
}

/// Fails the record after the processor tombstoned its key, `RETURNING expires_at`. Its
/// retention counts from now. A record that holds an effect id is never failed: the
/// charge must reach the ledger.
pub(crate) fn fail<'a, DB: Dialect>(owner: Owner<'a>, ttl: Duration) -> QueryBuilder<'a, DB> {
    let mut sql = DB::builder(
        "UPDATE idempotency_records SET state = 'failed', locked_until = NULL, expires_at = ",
    );
    DB::push_now_plus(&mut sql, ttl);
    push_touched_where_fenced(&mut sql, owner);
    sql.push(" AND effect_id IS NULL RETURNING expires_at");
    sql
}

/// Gives up the lock after an unknown outcome: the record stays pending and is stale at once,
/// so the next retry resumes it, and the completer settles it once the settle grace has
/// passed. Failing it instead would leave a charge the processor did make unrecorded.
pub(crate) fn release<'a, DB: Dialect>(owner: Owner<'a>) -> QueryBuilder<'a, DB> {
    let mut sql = DB::builder("UPDATE idempotency_records SET locked_until = ");
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
) -> Result<QueryBuilder<'a, DB>, StoreError> {
    let mut sql = DB::builder("");
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
) -> Result<QueryBuilder<'a, DB>, StoreError> {
    let mut sql = DB::builder("");
    push_completion(&mut sql, owner, response, ttl)?;
    sql.push(" AND effect_id IS NULL RETURNING expires_at");
    Ok(sql)
}

/// Pushes the statement of [`complete`] into `sql`, where it can be the gate of a statement
/// of the caller's (PostgreSQL's one-statement finish).
pub(crate) fn push_complete<'a, DB: Dialect>(
    sql: &mut QueryBuilder<'a, DB>,
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
    sql: &mut QueryBuilder<'a, DB>,
    owner: Owner<'a>,
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
    .push(", expires_at = ");
    DB::push_now_plus(sql, ttl);
    push_touched_where_fenced(sql, owner);
    Ok(())
}

/// `, updated_at = <now> WHERE <fence>`: every fenced statement matches only while the record
/// is still pending and still holds the generation (resource id) and attempt number this
/// attempt claimed with.
pub(crate) fn push_touched_where_fenced<'a, DB: Dialect>(
    sql: &mut QueryBuilder<'a, DB>,
    owner: Owner<'a>,
) {
    sql.push(", updated_at = ").push(DB::NOW);
    crate::claiming::push_where_key(sql, owner.scope, owner.key);
    sql.push(" AND attempts = ")
        .value(owner.fence.attempt.0)
        .push(" AND resource_id = ")
        .value(owner.fence.resource_id)
        .push(" AND state = 'pending'");
}

#[cfg(test)]
mod tests {
    use payments_idempotency::{Attempt, Fingerprint, IdempotencyPolicy};
    use serde_json::json;
    use sqlx::{Postgres, Sqlite};

    use payments_idempotency::engine::Fence;
    use payments_idempotency::{IdempotencyKey, Scope};

    use super::*;
    use crate::claiming;
    use crate::model::Generation;

    fn scope(tenant: &str) -> Scope {
        Scope {
            tenant: tenant.into(),
            operation: "charges.create.v1".into(),
        }
    }

    fn key(name: &str) -> IdempotencyKey {
        IdempotencyKey::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn fence(attempt: i32) -> Fence {
        Fence {
            attempt: Attempt(attempt),
            resource_id: Uuid::new_v4(),
        }
    }

    fn response(body: &[u8]) -> StoredResponse {
        StoredResponse::new(201, [("content-type", "application/json")], body.to_vec())
    }

    /// Every statement of a backend, for two different sets of values.
    fn statements<DB: Dialect>(a: &Inputs, b: &Inputs) -> Vec<(String, String)> {
        let each = |i: &Inputs| -> Vec<String> {
            let complete = complete::<DB>(i.owner(), &i.response, i.policy.ttl)
                .unwrap_or_else(|e| panic!("{e}"));
            vec![
                record_effect::<DB>(i.owner(), &i.charge_id).into_sql(),
                fail::<DB>(i.owner(), i.policy.ttl).into_sql(),
                release::<DB>(i.owner()).into_sql(),
                complete.into_sql(),
                claiming::insert_pending::<DB>(i.claim(), &i.generation, i.policy).into_sql(),
                claiming::take_over::<DB>(&i.scope, &i.key, i.policy.lock_timeout).into_sql(),
                claiming::replace::<DB>(i.claim(), &i.generation, i.policy).into_sql(),
                claiming::read_record::<DB>(&i.scope, &i.key, true).into_sql(),
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
