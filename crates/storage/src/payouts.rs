//! `PayoutRepository`.
//!
//! A payout's row has the id of its record's generation. While pending, it is the payout's
//! reservation on the tenant's balance, made under the balance's lock (`holding.rs`) before the
//! processor is called; the finish makes it paid and posts it, and a definitive failure deletes
//! it, in the transaction the engine ends the record in either way.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{
    Currency, Description, Destination, LedgerTransaction, PAYOUT_PAID, Payout, PayoutId,
    PayoutPaid, PayoutRequest, PayoutStatus, TenantId,
};

use uuid::Uuid;

use crate::Owner;
use crate::database::DatabaseStore;
use crate::holding::{self, FUNDS};
use crate::posting;
use crate::rows::{corrupt, money, page};
use crate::sql::{Each, Sql};
use crate::{StoreError, Transaction};

/// Payouts: the reservation of a payout's amount on the tenant's balance, the fenced writes
/// that end a payout, and the reads. A payout's row has the id of its record's generation, so
/// every attempt of one generation finds the same reservation.
#[async_trait]
pub trait PayoutRepository: Send + Sync {
    /// Reserves the payout's amount on the tenant's balance for the generation `owner` holds,
    /// in `transaction`, begun over its record: the balance's row is locked, so payouts and
    /// refunds of one tenant under different keys reserve one after the other and never take
    /// it below zero. Idempotent per generation: a reservation the generation already made is
    /// returned as it is.
    async fn reserve_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &PayoutRequest,
        created_at: DateTime<Utc>,
    ) -> Result<PayoutReservation, StoreError>;

    /// Writes each paid payout, its ledger transaction and its `payout.paid` outbox event in
    /// `transaction`, begun over the payouts' records (one, or a batch of finishes). The
    /// ledger's balances are taken in one order whatever the order given, so two transactions
    /// finishing payouts never wait for each other in a circle (storage.md's "Lock order").
    async fn finish_payouts(
        &self,
        transaction: &mut Transaction,
        payouts: &[&Payout],
    ) -> Result<(), StoreError>;

    /// Releases whatever the generation `owner` holds reserved, in `transaction`, begun over
    /// its record, which ends without a payout.
    async fn release_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError>;

    /// The tenant's payout with this id; another tenant's payout is simply not found.
    async fn get_payout(
        &self,
        tenant: &TenantId,
        id: PayoutId,
    ) -> Result<Option<Payout>, StoreError>;

    /// A page of the tenant's payouts, newest first, or `None` when the cursor is not one of
    /// its payouts.
    async fn list_payouts(
        &self,
        tenant: &TenantId,
        page: ListPayouts,
    ) -> Result<Option<PayoutPage>, StoreError>;

    /// The tenant's funds per currency, ordered by currency: what is available, and what its
    /// payouts in flight hold.
    async fn funds(&self, tenant: &TenantId) -> Result<Vec<Funds>, StoreError>;
}

/// What reserving a payout's amount on the tenant's balance came to.
#[derive(Debug, Clone)]
pub enum PayoutReservation {
    /// The payout's pending row, made now or by an earlier attempt of the same generation.
    Reserved(Payout),
    /// The balance does not cover the payout: only `available` is left in its currency.
    /// Nothing was reserved.
    InsufficientBalance { available: i64 },
}

/// A page request for the tenant's payouts: newest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListPayouts {
    pub limit: u32,
    pub starting_after: Option<PayoutId>,
}

/// One page of payouts, newest first.
#[derive(Debug, Clone)]
pub struct PayoutPage {
    pub payouts: Vec<Payout>,
    pub has_more: bool,
}

/// A tenant's money in one currency: what it may pay out or refund now, and what its payouts
/// in flight hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Funds {
    pub currency: Currency,
    /// The balance of the ledger's `customer_payments`, less what refunds and payouts in
    /// flight hold. Never below zero.
    pub available: i64,
    /// What payouts in flight hold.
    pub pending: i64,
    /// What the tenant's charges made with `"capture": false` hold on cards and have not yet
    /// captured or canceled: never available, never pending, not yet the tenant's.
    pub authorized: i64,
}

/// A `payouts` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PayoutRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub amount: i64,
    pub currency: String,
    pub destination: String,
    pub description: Option<String>,
    pub processor_payout_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl PayoutRow {
    /// A payout is paid exactly when it has its processor payout id (the schema's
    /// `paid_has_processor_payout`), so the id alone gives the status.
    pub(crate) fn into_payout(self) -> Result<Payout, StoreError> {
        Ok(Payout {
            id: PayoutId::from_uuid(self.id),
            tenant: TenantId::new(self.tenant_id),
            money: money(self.amount, &self.currency)?,
            destination: Destination::new(self.destination)
                .map_err(|e| StoreError::Corrupt(format!("destination: {e}")))?,
            description: self
                .description
                .map(Description::new)
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("description: {e}")))?,
            status: match self.processor_payout_id {
                Some(processor_payout_id) => PayoutStatus::Paid {
                    processor_payout_id,
                },
                None => PayoutStatus::Pending,
            },
            created_at: self.created_at,
        })
    }
}

/// A page of payouts, like [`charge_page`].
fn payout_page(rows: Vec<PayoutRow>, limit: u32) -> Result<PayoutPage, StoreError> {
    let (payouts, has_more) = page(rows, limit, PayoutRow::into_payout)?;
    Ok(PayoutPage { payouts, has_more })
}

/// One row of the funds query: currency, available, pending and authorized.
fn funds_from_row(
    (currency, available, pending, authorized): (String, i64, i64, i64),
) -> Result<Funds, StoreError> {
    Ok(Funds {
        currency: currency
            .parse()
            .map_err(|_| corrupt("currency", &currency))?,
        available,
        pending,
        authorized,
    })
}

/// The payout a generation (`$1`) reserved, if it did.
const RESERVED_PAYOUT: &str = "
SELECT id, tenant_id, amount, currency, destination, description, processor_payout_id,
       created_at
FROM payouts WHERE id = $1";

const INSERT_PENDING_PAYOUT: &str = "
INSERT INTO payouts
    (id, tenant_id, amount, currency, destination, description, status, created_at)
VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7)";

const PAY_PAYOUT: &str = "
UPDATE payouts SET status = 'paid', processor_payout_id = $2
WHERE id = $1 AND status = 'pending'";

/// What a paid payout (`$2`, of the tenant `$3`) posts, in one round trip: its ledger
/// transaction `$1` with its entries (the JSON array `$4`) and its `payout.paid` event (`$5` of
/// type `$6`, payload `$7`). One statement on PostgreSQL, which checks the entries' balance at
/// commit; one script on SQLite, whose entries go before their transaction's row, which seals
/// them (the schema's trigger checks that they balance).
const POST_PAYOUT: Each = Each {
    postgres: "
WITH ledger AS (
    INSERT INTO ledger_transactions (id, payout_id, tenant_id, created_at)
    VALUES ($1, $2, $3, now())
),
entries AS (
    INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
    SELECT $1, e.line, $3, e.entry ->> 'account', e.entry ->> 'currency',
           (e.entry ->> 'amount')::bigint
    FROM jsonb_array_elements($4) WITH ORDINALITY AS e(entry, line)
)
INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($5, $2, $3, $6, $7, now())",
    sqlite: "
INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
SELECT $1, e.key + 1, $3, e.value ->> 'account', e.value ->> 'currency', e.value ->> 'amount'
FROM json_each($4) AS e;

INSERT INTO ledger_transactions (id, payout_id, tenant_id, created_at)
VALUES ($1, $2, $3, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));

INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($5, $2, $3, $6, $7, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
};

const DELETE_PENDING_PAYOUT: &str = "DELETE FROM payouts WHERE id = $1 AND status = 'pending'";

const PAYOUT: &str = "
SELECT id, tenant_id, amount, currency, destination, description, processor_payout_id,
       created_at
FROM payouts WHERE tenant_id = $1 AND id = $2";

const PAYOUTS: &str = "
SELECT id, tenant_id, amount, currency, destination, description, processor_payout_id,
       created_at
FROM payouts WHERE tenant_id = $1
ORDER BY created_at DESC, id DESC LIMIT $2";

const PAYOUTS_AFTER: &str = "
SELECT id, tenant_id, amount, currency, destination, description, processor_payout_id,
       created_at
FROM payouts WHERE tenant_id = $1 AND (created_at, id) < ($2, $3)
ORDER BY created_at DESC, id DESC LIMIT $4";

#[async_trait]
impl PayoutRepository for DatabaseStore {
    async fn reserve_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &PayoutRequest,
        created_at: DateTime<Utc>,
    ) -> Result<PayoutReservation, StoreError> {
        let mut connection = transaction.connection();
        let made: Option<PayoutRow> = Sql::new(RESERVED_PAYOUT)
            .bind(owner.fence.generation)
            .fetch_optional(&mut connection)
            .await?;
        if let Some(made) = made {
            return Ok(PayoutReservation::Reserved(made.into_payout()?));
        }
        let tenant = owner.scope.tenant.as_str();
        let money = request.money;
        let available = holding::lock_available(&mut connection, tenant, money.currency).await?;
        if money.amount.minor_units() > available {
            return Ok(PayoutReservation::InsufficientBalance { available });
        }
        let payout = Payout {
            id: PayoutId::from_uuid(owner.fence.generation),
            tenant: TenantId::new(tenant),
            money,
            destination: request.destination.clone(),
            description: request.description.clone(),
            status: PayoutStatus::Pending,
            created_at,
        };
        Sql::new(INSERT_PENDING_PAYOUT)
            .bind(payout.id.as_uuid())
            .bind(tenant)
            .bind(money.amount.minor_units())
            .bind(money.currency.code())
            .bind(payout.destination.as_str())
            .bind(payout.description.as_ref().map(|d| d.as_str()))
            .bind(created_at)
            .execute(&mut connection)
            .await?;
        Ok(PayoutReservation::Reserved(payout))
    }

    async fn finish_payouts(
        &self,
        transaction: &mut Transaction,
        payouts: &[&Payout],
    ) -> Result<(), StoreError> {
        for payout in posting::in_balance_order(payouts, |p| (&p.tenant, p.money.currency)) {
            finish_payout(transaction, payout).await?;
        }
        Ok(())
    }

    /// Deletes the pending payout, whose amount the balance counted as held. Nothing to do
    /// when the generation reserved nothing.
    async fn release_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError> {
        Sql::new(DELETE_PENDING_PAYOUT)
            .bind(owner.fence.generation)
            .execute(&mut transaction.connection())
            .await?;
        Ok(())
    }

    async fn get_payout(
        &self,
        tenant: &TenantId,
        id: PayoutId,
    ) -> Result<Option<Payout>, StoreError> {
        let mut connection = self.acquire().await?;
        let row: Option<PayoutRow> = Sql::new(PAYOUT)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&mut connection.connection())
            .await?;
        row.map(PayoutRow::into_payout).transpose()
    }

    async fn list_payouts(
        &self,
        tenant: &TenantId,
        page: ListPayouts,
    ) -> Result<Option<PayoutPage>, StoreError> {
        let sql = match page.starting_after {
            None => Sql::new(PAYOUTS).bind(tenant.as_str()),
            Some(id) => match self.get_payout(tenant, id).await? {
                Some(cursor) => Sql::new(PAYOUTS_AFTER)
                    .bind(tenant.as_str())
                    .bind(cursor.created_at)
                    .bind(cursor.id.as_uuid()),
                None => return Ok(None),
            },
        };
        let mut connection = self.acquire().await?;
        let rows = sql
            .bind(i64::from(page.limit) + 1)
            .fetch_all(&mut connection.connection())
            .await?;
        payout_page(rows, page.limit).map(Some)
    }

    async fn funds(&self, tenant: &TenantId) -> Result<Vec<Funds>, StoreError> {
        let mut connection = self.acquire().await?;
        let rows: Vec<(String, i64, i64, i64)> = Sql::new(FUNDS)
            .bind(tenant.as_str())
            .bind(None::<&str>)
            .fetch_all(&mut connection.connection())
            .await?;
        rows.into_iter().map(funds_from_row).collect()
    }
}

/// One paid payout's rows, as [`PayoutRepository::finish_payouts`] writes each.
async fn finish_payout(transaction: &mut Transaction, payout: &Payout) -> Result<(), StoreError> {
    let PayoutStatus::Paid {
        processor_payout_id,
    } = &payout.status
    else {
        return Err(StoreError::Corrupt(format!(
            "payout {} finished without a processor payout",
            payout.id
        )));
    };
    let mut connection = transaction.connection();
    let paid = Sql::new(PAY_PAYOUT)
        .bind(payout.id.as_uuid())
        .bind(processor_payout_id.as_str())
        .execute(&mut connection)
        .await?;
    if paid != 1 {
        return Err(StoreError::Corrupt(format!(
            "payout {} has no reservation to finish",
            payout.id
        )));
    }
    let ledger = LedgerTransaction::for_payout(payout);
    let event = PayoutPaid::for_payout(payout);
    Sql::new(POST_PAYOUT)
        .bind(ledger.id())
        .bind(payout.id.as_uuid())
        .bind(payout.tenant.as_str())
        .bind(posting::entries(&ledger))
        .bind(event.event_id)
        .bind(PAYOUT_PAID)
        .bind(posting::payload(&event)?)
        .execute(&mut connection)
        .await?;
    Ok(())
}
