//! Charges and the ledger on SQLite: the reads, and the inserts one charge makes.

use async_trait::async_trait;
use payments_domain::{
    Charge, ChargeId, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted, TenantId,
};
use sqlx::SqliteConnection;

use super::{NOW, SqliteStore, stored_time};
use crate::StoreError;
use crate::model::{Balance, ChargePage};
use crate::repository::ChargeRepository;
use crate::rows::{ChargeRow, balance_from_row, charge_page};

const CHARGE_COLUMNS: &str =
    "id, tenant_id, amount, currency, source, description, processor_charge_id, created_at";

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

#[async_trait]
impl ChargeRepository for SqliteStore {
    async fn get_charge(
        &self,
        tenant: &TenantId,
        id: ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
        let sql = format!("SELECT {CHARGE_COLUMNS} FROM charges WHERE tenant_id = ?1 AND id = ?2");
        let row: Option<ChargeRow> = sqlx::query_as(&sql)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await?;
        row.map(ChargeRow::into_charge).transpose()
    }

    async fn charges_after(
        &self,
        tenant: &TenantId,
        cursor: Option<&Charge>,
        limit: u32,
    ) -> Result<ChargePage, StoreError> {
        // One row more than asked tells whether another page exists.
        let sql = format!(
            "SELECT {CHARGE_COLUMNS} FROM charges
             WHERE tenant_id = ?1 AND (?2 IS NULL OR (created_at, id) < (?2, ?3))
             ORDER BY created_at DESC, id DESC
             LIMIT ?4"
        );
        let rows: Vec<ChargeRow> = sqlx::query_as(&sql)
            .bind(tenant.as_str())
            .bind(cursor.map(|c| stored_time(c.created_at)))
            .bind(cursor.map(|c| c.id.as_uuid()))
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        charge_page(rows, limit)
    }

    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT account, currency, sum(amount) FROM ledger_entries
             WHERE tenant_id = ?1
             GROUP BY account, currency
             ORDER BY currency, account",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(balance_from_row).collect()
    }
}
