//! Charges and the ledger on SQLite: the reads, and the inserts one charge makes.

use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use sqlx::SqliteConnection;

use super::{NOW, SqliteStore, stored_time};
use crate::StoreError;
use crate::reading::impl_charge_repository;

/// Inserts a charge, its ledger transaction and its `payment.completed` event on `conn`, which
/// must be inside the caller's transaction. The entries go in before the transaction row:
/// inserting that row seals the transaction, and the schema's trigger checks it balances.
pub(super) async fn insert_charge_writes(
    conn: &mut SqliteConnection,
    charge: &Charge,
) -> Result<(), StoreError> {
    let ledger = LedgerTransaction::for_charge(charge);
    let event = PaymentCompleted::for_charge(charge);
    let payload = serde_json::to_string(&event)
        .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?;
    sqlx::query(
        "INSERT INTO charges
             (id, tenant_id, amount, currency, source, description, status, processor_charge_id,
              created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'succeeded', ?7, ?8)",
    )
    .bind(charge.id.as_uuid())
    .bind(charge.tenant.as_str())
    .bind(charge.money.amount.minor_units())
    .bind(charge.money.currency.code())
    .bind(charge.source.as_str())
    .bind(charge.description.as_ref().map(|d| d.as_str()))
    .bind(&charge.processor_charge_id)
    .bind(stored_time(charge.created_at))
    .execute(&mut *conn)
    .await?;
    for (line, entry) in (1_i64..).zip(ledger.entries()) {
        sqlx::query(
            "INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .bind(ledger.id())
        .bind(line)
        .bind(charge.tenant.as_str())
        .bind(entry.account.name())
        .bind(entry.currency.code())
        .bind(entry.amount)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(&format!(
        "INSERT INTO ledger_transactions (id, tenant_id, charge_id, created_at)
         VALUES (?1, ?2, ?3, {NOW})"
    ))
    .bind(ledger.id())
    .bind(charge.tenant.as_str())
    .bind(charge.id.as_uuid())
    .execute(&mut *conn)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, {NOW})"
    ))
    .bind(event.event_id)
    .bind(charge.tenant.as_str())
    .bind(PAYMENT_COMPLETED)
    .bind(charge.id.as_uuid())
    .bind(payload)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

impl_charge_repository!(SqliteStore, sqlx::Sqlite);
crate::refunding::impl_refund_repository!(SqliteStore, sqlx::Sqlite, begin_write);
