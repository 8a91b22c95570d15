//! The SQL of the fenced writes (`records.rs`) and of the finish, built with `QueryBuilder`:
//! each fragment binds its own values where it names them, so no statement depends on
//! parameter numbers kept in step elsewhere. The text is the same on every call, so each
//! statement is prepared once per connection and then comes from sqlx's statement cache.

use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use payments_idempotency::{IdempotencyKey, Scope, StoredResponse};
use sqlx::{Postgres, QueryBuilder};

use crate::StoreError;
use crate::model::Fence;
use crate::rows::{headers_to_json, stored_status};

/// The condition every fenced write carries: the record is still pending and still holds the
/// generation (resource id) and attempt number this attempt claimed with.
pub(super) fn push_fence<'a>(
    sql: &mut QueryBuilder<'a, Postgres>,
    scope: &'a Scope,
    key: &'a IdempotencyKey,
    fence: Fence,
) {
    sql.push("tenant_id = ")
        .push_bind(scope.tenant.as_str())
        .push(" AND operation = ")
        .push_bind(scope.operation.as_str())
        .push(" AND idempotency_key = ")
        .push_bind(key.as_str())
        .push(" AND attempts = ")
        .push_bind(fence.attempt.0)
        .push(" AND resource_id = ")
        .push_bind(fence.resource_id)
        .push(" AND state = 'pending'");
}

/// The assignments that complete a record with `response`. Retention is counted from the
/// completion (`ttl_secs` from now), never from the claim, so a record completed late in its
/// life is still replayed for the whole TTL.
pub(super) fn push_completion<'a>(
    sql: &mut QueryBuilder<'a, Postgres>,
    response: &'a StoredResponse,
    ttl_secs: f64,
) -> Result<(), StoreError> {
    sql.push("state = 'completed', recovery_point = 'finished', locked_until = NULL")
        .push(", response_status = ")
        .push_bind(stored_status(response)?)
        .push(", response_headers = ")
        .push_bind(headers_to_json(&response.headers))
        .push(", response_body = ")
        .push_bind(response.body.as_slice())
        .push(", expires_at = now() + make_interval(secs => ")
        .push_bind(ttl_secs)
        .push("), updated_at = now()");
    Ok(())
}

/// The inserts of a charge, its balanced ledger transaction and its event, as CTEs chained
/// from a CTE named `gate` that the caller wrote before: the charge selects from `gate`,
/// everything else from the charge, so no row is written unless the gate yields one. Shared
/// by the finish and the bench floor, so that both write exactly the same rows.
pub(super) fn push_charge_writes<'a>(
    sql: &mut QueryBuilder<'a, Postgres>,
    charge: &'a Charge,
) -> Result<(), StoreError> {
    let ledger = LedgerTransaction::for_charge(charge);
    let event = PaymentCompleted::for_charge(charge);
    let entries = ledger.entries();
    let lines: Vec<i16> = (1..).take(entries.len()).collect();
    let accounts: Vec<&'static str> = entries.iter().map(|e| e.account.name()).collect();
    let currencies: Vec<&'static str> = entries.iter().map(|e| e.currency.code()).collect();
    let amounts: Vec<i64> = entries.iter().map(|e| e.amount).collect();
    let payload = serde_json::to_value(&event)
        .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?;

    sql.push(
        "charge AS (
             INSERT INTO charges (id, tenant_id, amount, currency, source, description, status,
                                  processor_charge_id, created_at)
             SELECT ",
    );
    let mut values = sql.separated(", ");
    values
        .push_bind(charge.id.as_uuid())
        .push_bind(charge.tenant.as_str())
        .push_bind(charge.money.amount.minor_units())
        .push_bind(charge.money.currency.code())
        .push_bind(charge.source.as_str())
        .push_bind(charge.description.as_ref().map(|d| d.as_str()))
        .push("'succeeded'")
        .push_bind(charge.processor_charge_id.as_str())
        .push_bind(charge.created_at);
    sql.push(
        " FROM gate
             RETURNING id, tenant_id
         ),
         ledger AS (
             INSERT INTO ledger_transactions (id, tenant_id, charge_id)
             SELECT ",
    )
    .push_bind(ledger.id())
    .push(
        ", charge.tenant_id, charge.id FROM charge
             RETURNING id, tenant_id
         ),
         entries AS (
             INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
             SELECT ledger.id, e.line, ledger.tenant_id, e.account, e.currency, e.amount
             FROM ledger, UNNEST(",
    )
    .push_bind(lines)
    .push("::smallint[], ")
    .push_bind(accounts)
    .push("::text[], ")
    .push_bind(currencies)
    .push("::text[], ")
    .push_bind(amounts)
    .push(
        "::bigint[]) AS e(line, account, currency, amount)
         ),
         event AS (
             INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
             SELECT ",
    )
    .push_bind(event.event_id)
    .push(", charge.tenant_id, ")
    .push_bind(PAYMENT_COMPLETED)
    .push(", charge.id, ")
    .push_bind(payload)
    .push(" FROM charge)");
    Ok(())
}
