//! `ChargeRepository`: the finish's inserts (each backend's `insert_charge`) and the reads,
//! always within one tenant: another tenant's charge is simply not found.
//!
//! Lists page by keyset on `(created_at, id)`, newest first, which stays fast however deep a
//! client pages; each asks for one row more than the page, which tells whether another page
//! exists.

use async_trait::async_trait;
use payments_domain::{Charge, ChargeId, TenantId};
use payments_idempotency_sql::Connection;

use crate::model::{Balance, ChargePage};
use crate::repository::ChargeRepository;
use crate::rows::{self, ChargeRow};
use crate::sql::Sql;
use crate::store::DatabaseStore;
use crate::{StoreError, Transaction, postgres, sqlite};

const CHARGE: &str = "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded
FROM charges WHERE tenant_id = $1 AND id = $2";

const CHARGES: &str = "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded
FROM charges WHERE tenant_id = $1
ORDER BY created_at DESC, id DESC LIMIT $2";

const CHARGES_AFTER: &str = "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded
FROM charges WHERE tenant_id = $1 AND (created_at, id) < ($2, $3)
ORDER BY created_at DESC, id DESC LIMIT $4";

/// The tenant's balances per account and currency. The sum is cast back to a bigint
/// (PostgreSQL sums bigints as numeric): a tenant's balance is bounded far below i64 by the
/// charge amount limit.
const BALANCES: &str = "
SELECT account, currency, CAST(sum(amount) AS BIGINT) FROM ledger_entries
WHERE tenant_id = $1
GROUP BY account, currency ORDER BY currency, account";

#[async_trait]
impl ChargeRepository for DatabaseStore {
    async fn insert_charge(
        &self,
        transaction: &mut Transaction,
        charge: &Charge,
    ) -> Result<(), StoreError> {
        match transaction.connection() {
            Connection::Postgres(connection) => postgres::insert_charge(connection, charge).await,
            Connection::Sqlite(connection) => sqlite::insert_charge(connection, charge).await,
        }
    }

    async fn get_charge(
        &self,
        tenant: &TenantId,
        id: ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
        let mut connection = self.acquire().await?;
        let row: Option<ChargeRow> = Sql::new(CHARGE)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&mut connection.connection())
            .await?;
        row.map(ChargeRow::into_charge).transpose()
    }

    async fn charges_after(
        &self,
        tenant: &TenantId,
        cursor: Option<&Charge>,
        limit: u32,
    ) -> Result<ChargePage, StoreError> {
        let sql = match cursor {
            None => Sql::new(CHARGES).bind(tenant.as_str()),
            Some(cursor) => Sql::new(CHARGES_AFTER)
                .bind(tenant.as_str())
                .bind(cursor.created_at)
                .bind(cursor.id.as_uuid()),
        };
        let mut connection = self.acquire().await?;
        let rows = sql
            .bind(i64::from(limit) + 1)
            .fetch_all(&mut connection.connection())
            .await?;
        rows::charge_page(rows, limit)
    }

    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError> {
        let mut connection = self.acquire().await?;
        let rows: Vec<(String, String, i64)> = Sql::new(BALANCES)
            .bind(tenant.as_str())
            .fetch_all(&mut connection.connection())
            .await?;
        rows.into_iter().map(rows::balance_from_row).collect()
    }
}
