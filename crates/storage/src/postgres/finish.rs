//! Fenced writes of an owning attempt: recovery points and the finishing transaction.

use chrono::{DateTime, Utc};
use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use payments_idempotency::{IdempotencyKey, Scope, StoredResponse};

use super::{PgStore, secs};
use crate::StoreError;
use crate::model::{Completion, Fence, Finish};
use crate::rows::{headers_to_json, stored_status};

// Every statement below carries this condition: the record is still pending and still holds
// the generation (resource id) and attempt number this attempt claimed with.
const FENCE: &str = "tenant_id = $1 AND operation = $2 AND idempotency_key = $3
                     AND attempts = $4 AND resource_id = $5 AND state = 'pending'";

type FencedQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// `UPDATE idempotency_records SET <set> WHERE <fence>` with the fence's five parameters
/// bound; `set` may use `$6` onwards.
fn fenced_update<'q>(
    sql: &'q str,
    scope: &'q Scope,
    key: &'q IdempotencyKey,
    fence: Fence,
) -> FencedQuery<'q> {
    sqlx::query(sql)
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .bind(fence.attempt.0)
        .bind(fence.resource_id)
}

fn fenced_sql(set: &str) -> String {
    format!("UPDATE idempotency_records SET {set}, updated_at = now() WHERE {FENCE}")
}

impl PgStore {
    /// Records that the processor confirmed the charge, so that a takeover resumes from here.
    pub(crate) async fn record_charged(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        processor_charge_id: &str,
    ) -> Result<Finish, StoreError> {
        let sql = fenced_sql("recovery_point = 'charged', processor_charge_id = $6");
        let done = fenced_update(&sql, scope, key, fence)
            .bind(processor_charge_id)
            .execute(&self.pool)
            .await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Marks the record failed after the processor tombstoned its key. A record that holds a
    /// processor charge id is never failed: the charge must reach the ledger.
    pub(crate) async fn mark_failed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET state = 'failed', locked_until = NULL,
                 expires_at = now() + make_interval(secs => $6), updated_at = now()
             WHERE {FENCE} AND processor_charge_id IS NULL"
        );
        let done = fenced_update(&sql, scope, key, fence)
            .bind(secs(self.policy.ttl))
            .execute(&self.pool)
            .await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Gives up the lock after an unknown outcome (the processor timed out or was unreachable):
    /// the record stays pending and becomes stale at once, so the next retry resumes it and, if
    /// nobody retries, the completer asks the processor whether the charge happened. Marking it
    /// failed instead would leave a charge the processor did make unrecorded.
    pub(crate) async fn release_lock(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        let sql = fenced_sql("locked_until = now()");
        let done = fenced_update(&sql, scope, key, fence)
            .execute(&self.pool)
            .await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Completes the record with a response that created nothing (a decline).
    pub(crate) async fn finish_without_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let sql =
            format!("UPDATE idempotency_records SET {COMPLETE} WHERE {FENCE} RETURNING expires_at");
        let stored: Option<DateTime<Utc>> = sqlx::query_scalar(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(fence.attempt.0)
            .bind(fence.resource_id)
            .bind(stored_status(response)?)
            .bind(headers_to_json(&response.headers))
            .bind(&response.body)
            .bind(secs(self.policy.ttl))
            .fetch_optional(&self.pool)
            .await?;
        Ok(completion(stored))
    }

    /// Writes the charge, its ledger transaction, its `payment.completed` outbox event and the
    /// completed record as ONE statement: either all of them exist or none does.
    ///
    /// Data-modifying CTEs make it a single round trip and a single commit. The fenced update of
    /// the record is the gate every insert selects from: if another attempt owns the record,
    /// the update matches no row and nothing else is written. The ledger's balance trigger and
    /// the foreign keys are checked at the end of the statement and at commit as usual.
    pub(crate) async fn finish_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        let status = stored_status(response)?;
        let sql = format!(
            "WITH gate AS (
                 UPDATE idempotency_records SET {COMPLETE} WHERE {FENCE}
                 RETURNING expires_at
             ),
             {}
             SELECT expires_at FROM gate",
            charge_writes(10)
        );
        let query = sqlx::query_scalar(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(fence.attempt.0)
            .bind(fence.resource_id)
            .bind(status)
            .bind(headers_to_json(&response.headers))
            .bind(&response.body)
            .bind(secs(self.policy.ttl));
        let stored: Option<DateTime<Utc>> = bind_charge_writes(query, charge)?
            .fetch_optional(&self.pool)
            .await?;
        Ok(completion(stored))
    }
}

// The completion of a record, with parameters $6 (status), $7 (headers), $8 (body) and $9
// (the TTL in seconds): retention is counted from the completion, never from the claim, so a
// record completed late in its life is still replayed for the whole TTL.
const COMPLETE: &str = "state = 'completed', recovery_point = 'finished', locked_until = NULL,
     response_status = $6, response_headers = $7, response_body = $8,
     expires_at = now() + make_interval(secs => $9), updated_at = now()";

fn completion(stored: Option<DateTime<Utc>>) -> Completion {
    match stored {
        Some(expires_at) => Completion::Stored { expires_at },
        None => Completion::Fenced,
    }
}

/// The inserts of a charge, its balanced ledger transaction and its event, as CTEs chained
/// from a CTE named `gate`: the charge selects from `gate`, everything else from the charge,
/// so no row is written unless the gate yields one. Parameters are numbered from `first`. Shared by the guarded
/// finish and the bench floor so that both write exactly the same rows.
pub(super) fn charge_writes(first: usize) -> String {
    let p: Vec<String> = (first..first + 16).map(|i| format!("${i}")).collect();
    format!(
        "charge AS (
             INSERT INTO charges
                 (id, tenant_id, amount, currency, source, description, status, processor_charge_id, created_at)
             SELECT {}, {}, {}, {}, {}, {}, 'succeeded', {}, {} FROM gate
             RETURNING id, tenant_id
         ),
         ledger AS (
             INSERT INTO ledger_transactions (id, tenant_id, charge_id)
             SELECT {}, charge.tenant_id, charge.id FROM charge
             RETURNING id, tenant_id
         ),
         entries AS (
             INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
             SELECT ledger.id, e.line, ledger.tenant_id, e.account, e.currency, e.amount
             FROM ledger, UNNEST({}::smallint[], {}::text[], {}::text[], {}::bigint[])
                  AS e(line, account, currency, amount)
         ),
         event AS (
             INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
             SELECT {}, charge.tenant_id, {}, charge.id, {} FROM charge
         )",
        p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15],
    )
}

pub(super) type ScalarQuery<'q, T> =
    sqlx::query::QueryScalar<'q, sqlx::Postgres, T, sqlx::postgres::PgArguments>;

/// Binds the 16 parameters of [`charge_writes`], in order.
pub(super) fn bind_charge_writes<'q, T>(
    query: ScalarQuery<'q, T>,
    charge: &'q Charge,
) -> Result<ScalarQuery<'q, T>, StoreError> {
    let ledger = LedgerTransaction::for_charge(charge);
    let event = PaymentCompleted::for_charge(charge);
    let entries = ledger.entries();
    let lines: Vec<i16> = (1..).take(entries.len()).collect();
    let accounts: Vec<&'static str> = entries.iter().map(|e| e.account.name()).collect();
    let currencies: Vec<&'static str> = entries.iter().map(|e| e.currency.code()).collect();
    let amounts: Vec<i64> = entries.iter().map(|e| e.amount).collect();
    let payload = serde_json::to_value(&event)
        .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?;
    Ok(query
        .bind(charge.id.as_uuid())
        .bind(charge.tenant.as_str())
        .bind(charge.money.amount.minor_units())
        .bind(charge.money.currency.code())
        .bind(charge.source.as_str())
        .bind(charge.description.as_ref().map(|d| d.as_str()))
        .bind(&charge.processor_charge_id)
        .bind(charge.created_at)
        .bind(ledger.id())
        .bind(lines)
        .bind(accounts)
        .bind(currencies)
        .bind(amounts)
        .bind(event.event_id)
        .bind(PAYMENT_COMPLETED)
        .bind(payload))
}
