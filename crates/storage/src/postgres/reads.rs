//! Reading charges and ledger balances back, always within one tenant.

use async_trait::async_trait;
use payments_domain::{Charge, ChargeId, TenantId};

use super::PgStore;
use crate::StoreError;
use crate::model::{Balance, ChargePage};
use crate::repository::ChargeRepository;
use crate::rows::{ChargeRow, balance_from_row, charge_page};

const CHARGE_COLUMNS: &str =
    "id, tenant_id, amount, currency, source, description, processor_charge_id, created_at";

#[async_trait]
impl ChargeRepository for PgStore {
    /// The tenant's charge with this id; another tenant's charge is simply not found.
    async fn get_charge(
        &self,
        tenant: &TenantId,
        id: ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
        let sql = format!("SELECT {CHARGE_COLUMNS} FROM charges WHERE tenant_id = $1 AND id = $2");
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
             WHERE tenant_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
             ORDER BY created_at DESC, id DESC
             LIMIT $4"
        );
        let rows: Vec<ChargeRow> = sqlx::query_as(&sql)
            .bind(tenant.as_str())
            .bind(cursor.map(|c| c.created_at))
            .bind(cursor.map(|c| c.id.as_uuid()))
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        charge_page(rows, limit)
    }

    /// The tenant's balances, ordered by currency then account.
    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError> {
        // sum(bigint) is numeric in PostgreSQL; it is cast back because a tenant's balance is
        // bounded far below i64 by the charge amount limit.
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT account, currency, sum(amount)::bigint FROM ledger_entries
             WHERE tenant_id = $1
             GROUP BY account, currency
             ORDER BY currency, account",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(balance_from_row).collect()
    }
}
