//! Reading charges back, always within one tenant.

use payments_domain::{Charge, ChargeId, TenantId};

use super::PgStore;
use crate::StoreError;
use crate::model::{ChargePage, ListCharges};
use crate::rows::{ChargeRow, charge_page};

const CHARGE_COLUMNS: &str =
    "id, tenant_id, amount, currency, source, description, processor_charge_id, created_at";

impl PgStore {
    /// The tenant's charge with this id; another tenant's charge is simply not found.
    pub(crate) async fn get_charge(
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

    /// A page of the tenant's charges, or `None` when the cursor is not one of its charges.
    pub(crate) async fn list_charges(
        &self,
        tenant: &TenantId,
        page: ListCharges,
    ) -> Result<Option<ChargePage>, StoreError> {
        let cursor = match page.starting_after {
            Some(id) => match self.get_charge(tenant, id).await? {
                Some(charge) => Some(charge),
                None => return Ok(None),
            },
            None => None,
        };
        // One row more than asked tells whether another page exists. Keyset pagination on
        // (created_at, id) stays fast however deep the client pages.
        let sql = format!(
            "SELECT {CHARGE_COLUMNS} FROM charges
             WHERE tenant_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
             ORDER BY created_at DESC, id DESC
             LIMIT $4"
        );
        let rows: Vec<ChargeRow> = sqlx::query_as(&sql)
            .bind(tenant.as_str())
            .bind(cursor.as_ref().map(|c| c.created_at))
            .bind(cursor.as_ref().map(|c| c.id.as_uuid()))
            .bind(i64::from(page.limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        charge_page(rows, page.limit).map(Some)
    }
}
