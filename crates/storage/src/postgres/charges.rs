//! Reading charges back, always within one tenant.

use payments_domain::{Charge, ChargeId, TenantId};

use super::PgStore;
use crate::StoreError;
use crate::model::ChargePage;
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

    pub(crate) async fn charges_after(
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
}
