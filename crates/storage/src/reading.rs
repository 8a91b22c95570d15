//! `ChargeRepository`, written once for both backends over any [`SqlStore`]: the finish's
//! inserts (each backend's `insert_charge`) and the reads, always within one tenant: another
//! tenant's charge is simply not found.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{Charge, ChargeId, TenantId};
use uuid::Uuid;

use crate::StoreError;
use crate::Transaction;
use crate::dialect::{Dialect, Statement};
use crate::model::{Balance, ChargePage};
use crate::repository::ChargeRepository;
use crate::rows::{self, ChargeRow};
use crate::sql_store::SqlStore;

const SELECT_CHARGES: &str = "SELECT id, tenant_id, amount, currency, source, description, \
                              processor_charge_id, created_at, amount_refunded FROM charges";

/// The tenant's charge with this id.
pub(crate) fn charge<'a, DB: Dialect>(tenant: &'a TenantId, id: ChargeId) -> Statement<'a, DB> {
    let mut sql = Statement::new(SELECT_CHARGES);
    push_tenants_id(&mut sql, tenant, id.as_uuid());
    sql
}

/// ` WHERE tenant_id = <tenant> AND id = <id>`: one tenant's object by its id.
pub(crate) fn push_tenants_id<'a, DB: Dialect>(
    sql: &mut Statement<'a, DB>,
    tenant: &'a TenantId,
    id: Uuid,
) {
    sql.push(" WHERE tenant_id = ")
        .value(tenant.as_str())
        .push(" AND id = ")
        .value(id);
}

/// ` WHERE tenant_id = <tenant> [AND (created_at, id) < <cursor>] ORDER BY .. LIMIT ..`: up to
/// `limit` + 1 of the tenant's objects, newest first, after `cursor` (keyset pagination on
/// `(created_at, id)`, which stays fast however deep a client pages). The row more than asked
/// tells whether another page exists. `filter` narrows the tenant's objects (a charge's
/// refunds).
pub(crate) fn push_page<'a, DB: Dialect>(
    sql: &mut Statement<'a, DB>,
    tenant: &'a TenantId,
    filter: Option<(&'static str, Uuid)>,
    cursor: Option<(DateTime<Utc>, Uuid)>,
    limit: u32,
) {
    sql.push(" WHERE tenant_id = ").value(tenant.as_str());
    if let Some((column, value)) = filter {
        sql.push(" AND ").push(column).push(" = ").value(value);
    }
    if let Some((created_at, id)) = cursor {
        sql.push(" AND (created_at, id) < (");
        DB::push_time(sql, created_at);
        sql.push(", ").value(id).push(")");
    }
    sql.push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .value(i64::from(limit) + 1);
}

/// Up to `limit` + 1 of the tenant's charges, newest first, after `cursor` ([`push_page`]).
pub(crate) fn charges_after<'a, DB: Dialect>(
    tenant: &'a TenantId,
    cursor: Option<&'a Charge>,
    limit: u32,
) -> Statement<'a, DB> {
    let mut sql = Statement::new(SELECT_CHARGES);
    let cursor = cursor.map(|c| (c.created_at, c.id.as_uuid()));
    push_page(&mut sql, tenant, None, cursor, limit);
    sql
}

/// The tenant's balances per account and currency, ordered by currency then account. The sum
/// is cast back to a bigint (PostgreSQL sums bigints as numeric): a tenant's balance is
/// bounded far below i64 by the charge amount limit.
pub(crate) fn balances<'a, DB: Dialect>(tenant: &'a TenantId) -> Statement<'a, DB> {
    let mut sql = Statement::new(
        "SELECT account, currency, CAST(sum(amount) AS BIGINT) FROM ledger_entries
         WHERE tenant_id = ",
    );
    sql.value(tenant.as_str())
        .push(" GROUP BY account, currency ORDER BY currency, account");
    sql
}

#[async_trait]
impl<S: SqlStore> ChargeRepository for S {
    async fn insert_charge(
        &self,
        transaction: &mut Transaction,
        charge: &Charge,
    ) -> Result<(), StoreError> {
        S::insert_charge(S::write_in(transaction)?, charge).await
    }

    async fn get_charge(
        &self,
        tenant: &TenantId,
        id: ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let row: Option<ChargeRow> = charge::<S::Db>(tenant, id)
            .fetch_optional(&mut connection)
            .await?;
        row.map(ChargeRow::into_charge).transpose()
    }

    async fn charges_after(
        &self,
        tenant: &TenantId,
        cursor: Option<&Charge>,
        limit: u32,
    ) -> Result<ChargePage, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let rows = charges_after::<S::Db>(tenant, cursor, limit)
            .fetch_all(&mut connection)
            .await?;
        rows::charge_page(rows, limit)
    }

    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let rows: Vec<(String, String, i64)> =
            balances::<S::Db>(tenant).fetch_all(&mut connection).await?;
        rows.into_iter().map(rows::balance_from_row).collect()
    }
}
