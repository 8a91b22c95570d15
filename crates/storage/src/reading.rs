//! The reads of charges and balances, written once for both backends, always within one
//! tenant: another tenant's charge is simply not found.

use payments_domain::{Charge, ChargeId, TenantId};
use sqlx::QueryBuilder;

use crate::fenced::{Dialect, PushValue};

const SELECT_CHARGES: &str = "SELECT id, tenant_id, amount, currency, source, description, \
                              processor_charge_id, created_at, amount_refunded FROM charges";

/// The tenant's charge with this id.
pub(crate) fn charge<'a, DB: Dialect>(tenant: &'a TenantId, id: ChargeId) -> QueryBuilder<'a, DB> {
    let mut sql = DB::builder(SELECT_CHARGES);
    sql.push(" WHERE tenant_id = ")
        .value(tenant.as_str())
        .push(" AND id = ")
        .value(id.as_uuid());
    sql
}

/// Up to `limit` + 1 of the tenant's charges, newest first, after `cursor` (keyset
/// pagination on `(created_at, id)`): the row more than asked tells whether another page
/// exists.
pub(crate) fn charges_after<'a, DB: Dialect>(
    tenant: &'a TenantId,
    cursor: Option<&'a Charge>,
    limit: u32,
) -> QueryBuilder<'a, DB> {
    let mut sql = DB::builder(SELECT_CHARGES);
    sql.push(" WHERE tenant_id = ").value(tenant.as_str());
    if let Some(cursor) = cursor {
        sql.push(" AND (created_at, id) < (");
        DB::push_time(&mut sql, cursor.created_at);
        sql.push(", ").value(cursor.id.as_uuid()).push(")");
    }
    sql.push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .value(i64::from(limit) + 1);
    sql
}

/// The tenant's balances per account and currency, ordered by currency then account. The sum
/// is cast back to a bigint (PostgreSQL sums bigints as numeric): a tenant's balance is
/// bounded far below i64 by the charge amount limit.
pub(crate) fn balances<'a, DB: Dialect>(tenant: &'a TenantId) -> QueryBuilder<'a, DB> {
    let mut sql = DB::builder(
        "SELECT account, currency, CAST(sum(amount) AS BIGINT) FROM ledger_entries
         WHERE tenant_id = ",
    );
    sql.value(tenant.as_str())
        .push(" GROUP BY account, currency ORDER BY currency, account");
    sql
}

/// Implements `ChargeRepository` for a backend's store (`$store`, with a `pool` of database
/// `$db` and the backend's `write_charge`) with the statements above: the one implementation
/// both backends use.
macro_rules! impl_charge_repository {
    ($store:ty, $db:ty) => {
        #[async_trait::async_trait]
        impl $crate::repository::ChargeRepository for $store {
            async fn finish_charge(
                &self,
                owner: payments_idempotency::engine::Owner<'_>,
                charge: &payments_domain::Charge,
                response: &payments_idempotency::StoredResponse,
            ) -> Result<payments_idempotency::engine::Completion, $crate::StoreError> {
                self.write_charge($crate::recording::ChargeFinish {
                    owner,
                    charge,
                    response,
                })
                .await
            }

            async fn get_charge(
                &self,
                tenant: &payments_domain::TenantId,
                id: payments_domain::ChargeId,
            ) -> Result<Option<payments_domain::Charge>, $crate::StoreError> {
                let mut sql = $crate::reading::charge::<$db>(tenant, id);
                let row: Option<$crate::rows::ChargeRow> =
                    sql.build_query_as().fetch_optional(&self.pool).await?;
                row.map($crate::rows::ChargeRow::into_charge).transpose()
            }

            async fn charges_after(
                &self,
                tenant: &payments_domain::TenantId,
                cursor: Option<&payments_domain::Charge>,
                limit: u32,
            ) -> Result<$crate::model::ChargePage, $crate::StoreError> {
                let mut sql = $crate::reading::charges_after::<$db>(tenant, cursor, limit);
                let rows = sql.build_query_as().fetch_all(&self.pool).await?;
                $crate::rows::charge_page(rows, limit)
            }

            async fn balances(
                &self,
                tenant: &payments_domain::TenantId,
            ) -> Result<Vec<$crate::model::Balance>, $crate::StoreError> {
                let mut sql = $crate::reading::balances::<$db>(tenant);
                let rows: Vec<(String, String, i64)> =
                    sql.build_query_as().fetch_all(&self.pool).await?;
                rows.into_iter()
                    .map($crate::rows::balance_from_row)
                    .collect()
            }
        }
    };
}

pub(crate) use impl_charge_repository;
