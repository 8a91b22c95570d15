//! `ChargeRepository`: the finish's inserts (each backend's `insert_charge`) and the reads,
//! always within one tenant: another tenant's charge is simply not found.
//!
//! Lists page by keyset on `(created_at, id)`, newest first, which stays fast however deep a
//! client pages; each asks for one row more than the page, which tells whether another page
//! exists.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{
    Account, Amount, CancellationReason, Capture, Charge, ChargeId, Currency, Description,
    ManualCapture, PaymentSource, TenantId,
};
use payments_idempotency_sql::Connection;
use uuid::Uuid;

use crate::database::DatabaseStore;
use crate::rows::{corrupt, money, page};
use crate::sql::Sql;
use crate::{StoreError, Transaction, postgres, sqlite};

/// Charges and the ledger: the charge operation's finish, and the reads within one tenant.
#[async_trait]
pub trait ChargeRepository: Send + Sync {
    /// Writes the charge, its ledger transaction and its `payment.completed` outbox event in
    /// `transaction`, begun over the charge's record.
    async fn insert_charge(
        &self,
        transaction: &mut Transaction,
        charge: &Charge,
    ) -> Result<(), StoreError>;

    /// Writes several charges, each with its ledger transaction and its event, in
    /// `transaction` (a batch of finishes, whose records are completed in it): on PostgreSQL
    /// in one statement, on SQLite one charge after another.
    async fn insert_charges(
        &self,
        transaction: &mut Transaction,
        charges: &[&Charge],
    ) -> Result<(), StoreError>;

    /// The tenant's charge with this id; another tenant's charge is simply not found.
    async fn get_charge(
        &self,
        tenant: &TenantId,
        id: ChargeId,
    ) -> Result<Option<Charge>, StoreError>;

    /// A page of the tenant's charges, or `None` when the cursor is not one of its charges.
    async fn list_charges(
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
        self.charges_after(tenant, cursor.as_ref(), page.limit)
            .await
            .map(Some)
    }

    /// Up to `limit` of the tenant's charges, newest first, older than `cursor` (keyset
    /// pagination on `(created_at, id)`, which stays fast however deep a client pages).
    async fn charges_after(
        &self,
        tenant: &TenantId,
        cursor: Option<&Charge>,
        limit: u32,
    ) -> Result<ChargePage, StoreError>;

    /// The tenant's balances, ordered by currency then account.
    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError>;
}

/// A page request: newest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListCharges {
    pub limit: u32,
    pub starting_after: Option<ChargeId>,
}

/// One page of charges, newest first.
#[derive(Debug, Clone)]
pub struct ChargePage {
    pub charges: Vec<Charge>,
    pub has_more: bool,
}

/// The signed sum of one account's entries in one currency (debits positive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balance {
    pub account: Account,
    pub currency: Currency,
    pub balance: i64,
}

/// A `charges` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ChargeRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub amount: i64,
    pub currency: String,
    pub source: String,
    pub description: Option<String>,
    pub processor_charge_id: String,
    pub created_at: DateTime<Utc>,
    pub amount_refunded: i64,
    pub capture_status: Option<String>,
    pub capture_before: Option<DateTime<Utc>>,
    pub amount_captured: Option<i64>,
    pub cancellation_reason: Option<String>,
}

impl ChargeRow {
    /// Where the charge's money stands, from its capture columns (`charges_held_until` and
    /// `charges_captured_within_amount` keep them consistent).
    fn capture(&self) -> Result<Capture, StoreError> {
        let Some(capture_before) = self.capture_before else {
            return Ok(Capture::Automatic);
        };
        let state = match (self.capture_status.as_deref(), self.amount_captured) {
            (Some("requires_capture"), _) => ManualCapture::RequiresCapture,
            (Some("captured"), Some(captured)) => ManualCapture::Captured {
                amount: Amount::new(captured).map_err(|_| corrupt("amount_captured", captured))?,
            },
            (Some("canceled"), _) => ManualCapture::Canceled {
                reason: self
                    .cancellation_reason
                    .as_deref()
                    .map(|name| {
                        CancellationReason::from_name(name)
                            .ok_or_else(|| corrupt("cancellation_reason", name))
                    })
                    .transpose()?,
            },
            (status, _) => return Err(corrupt("capture_status", status)),
        };
        Ok(Capture::Manual {
            capture_before,
            state,
        })
    }

    pub(crate) fn into_charge(self) -> Result<Charge, StoreError> {
        let capture = self.capture()?;
        Ok(Charge {
            id: ChargeId::from_uuid(self.id),
            tenant: TenantId::new(self.tenant_id),
            money: money(self.amount, &self.currency)?,
            source: PaymentSource::new(self.source)
                .map_err(|e| StoreError::Corrupt(format!("source: {e}")))?,
            description: self
                .description
                .map(Description::new)
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("description: {e}")))?,
            processor_charge_id: self.processor_charge_id,
            created_at: self.created_at,
            amount_refunded: self.amount_refunded,
            capture,
        })
    }
}

/// A page of charges from the rows of a query that asked for one more than `limit`.
fn charge_page(rows: Vec<ChargeRow>, limit: u32) -> Result<ChargePage, StoreError> {
    let (charges, has_more) = page(rows, limit, ChargeRow::into_charge)?;
    Ok(ChargePage { charges, has_more })
}

/// One row of the balance query: account, currency and the signed sum.
fn balance_from_row(
    (account, currency, balance): (String, String, i64),
) -> Result<Balance, StoreError> {
    Ok(Balance {
        account: Account::from_name(&account).ok_or_else(|| corrupt("account", &account))?,
        currency: currency
            .parse()
            .map_err(|_| corrupt("currency", &currency))?,
        balance,
    })
}

const CHARGE: &str = "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded, capture_status, capture_before, amount_captured, cancellation_reason
FROM charges WHERE tenant_id = $1 AND id = $2";

const CHARGES: &str = "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded, capture_status, capture_before, amount_captured, cancellation_reason
FROM charges WHERE tenant_id = $1
ORDER BY created_at DESC, id DESC LIMIT $2";

const CHARGES_AFTER: &str = "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded, capture_status, capture_before, amount_captured, cancellation_reason
FROM charges WHERE tenant_id = $1 AND (created_at, id) < ($2, $3)
ORDER BY created_at DESC, id DESC LIMIT $4";

/// The tenant's balances per account and currency: the sums of their parts, which the
/// database keeps as entries are written (`ledger_balances`), so the read does not grow with
/// the tenant's history. The sum is cast back to a bigint (PostgreSQL sums bigints as
/// numeric): a tenant's balance is bounded far below i64 by the charge amount limit.
const BALANCES: &str = "
SELECT account, currency, CAST(sum(amount) AS BIGINT) FROM ledger_balances
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

    async fn insert_charges(
        &self,
        transaction: &mut Transaction,
        charges: &[&Charge],
    ) -> Result<(), StoreError> {
        match transaction.connection() {
            Connection::Postgres(connection) => postgres::insert_charges(connection, charges).await,
            Connection::Sqlite(connection) => {
                for charge in charges {
                    sqlite::insert_charge(connection, charge).await?;
                }
                Ok(())
            }
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
        charge_page(rows, limit)
    }

    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError> {
        let mut connection = self.acquire().await?;
        let rows: Vec<(String, String, i64)> = Sql::new(BALANCES)
            .bind(tenant.as_str())
            .fetch_all(&mut connection.connection())
            .await?;
        rows.into_iter().map(balance_from_row).collect()
    }
}
