//! Ledger balances per account and currency.

use payments_domain::TenantId;

use super::PgStore;
use crate::StoreError;
use crate::model::Balance;
use crate::rows::balance_from_row;

impl PgStore {
    /// The tenant's balances, ordered by currency then account.
    pub(crate) async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError> {
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
