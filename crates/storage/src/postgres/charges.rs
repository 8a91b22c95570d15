//! The inserts of the one-statement finish on PostgreSQL, a [`Statement`] like the fenced
//! writes they hang on (`crate::fenced`).

use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use sqlx::Postgres;

use crate::StoreError;
use crate::dialect::Statement;

/// The inserts of a charge, its balanced ledger transaction and its event, as CTEs chained
/// from a CTE named `gate` that the caller wrote before: the charge selects from `gate`,
/// everything else from the charge, so no row is written unless the gate yields one. Shared
/// by the finish and the bench floor, so that both write exactly the same rows.
pub(super) fn push_charge_writes<'a>(
    sql: &mut Statement<'a, Postgres>,
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
    sql.value(charge.id.as_uuid())
        .push(", ")
        .value(charge.tenant.as_str())
        .push(", ")
        .value(charge.money.amount.minor_units())
        .push(", ")
        .value(charge.money.currency.code())
        .push(", ")
        .value(charge.source.as_str())
        .push(", ")
        .value(charge.description.as_ref().map(|d| d.as_str()))
        .push(", 'succeeded', ")
        .value(charge.processor_charge_id.as_str())
        .push(", ")
        .value(charge.created_at)
        .push(
            " FROM gate
             RETURNING id, tenant_id
         ),
         ledger AS (
             INSERT INTO ledger_transactions (id, tenant_id, charge_id)
             SELECT ",
        )
        .value(ledger.id())
        .push(
            ", charge.tenant_id, charge.id FROM charge
             RETURNING id, tenant_id
         ),
         entries AS (
             INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
             SELECT ledger.id, e.line, ledger.tenant_id, e.account, e.currency, e.amount
             FROM ledger, UNNEST(",
        )
        .value(lines)
        .push("::smallint[], ")
        .value(accounts)
        .push("::text[], ")
        .value(currencies)
        .push("::text[], ")
        .value(amounts)
        .push(
            "::bigint[]) AS e(line, account, currency, amount)
         ),
         event AS (
             INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
             SELECT ",
        )
        .value(event.event_id)
        .push(", charge.tenant_id, ")
        .value(PAYMENT_COMPLETED)
        .push(", charge.id, ")
        .value(payload)
        .push(" FROM charge)");
    Ok(())
}
