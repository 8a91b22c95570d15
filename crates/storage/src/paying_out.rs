//! `PayoutRepository`.
//!
//! A payout's row has the id of its record's generation. While pending, it is the payout's
//! reservation on the tenant's balance, made under the balance's lock (`holding.rs`) before the
//! processor is called; the finish makes it paid and posts it, and a definitive failure deletes
//! it, in the transaction the engine ends the record in either way.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{
    LedgerTransaction, PAYOUT_PAID, Payout, PayoutId, PayoutPaid, PayoutRequest, PayoutStatus,
    TenantId,
};

use crate::holding::{self, FUNDS};
use crate::model::{Funds, ListPayouts, Owner, PayoutPage, PayoutReservation};
use crate::posting::{self, Posted};
use crate::repository::PayoutRepository;
use crate::rows::{self, PayoutRow};
use crate::sql::Sql;
use crate::store::DatabaseStore;
use crate::{StoreError, Transaction};

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

    async fn finish_payout(
        &self,
        transaction: &mut Transaction,
        payout: &Payout,
    ) -> Result<(), StoreError> {
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
        let tenant = payout.tenant.as_str();
        let posted = Posted::Payout(payout.id.as_uuid());
        let ledger = LedgerTransaction::for_payout(payout);
        posting::post_ledger(&mut connection, &ledger, tenant, posted).await?;
        let event = PayoutPaid::for_payout(payout);
        let (id, aggregate) = (event.event_id, payout.id.as_uuid());
        posting::insert_event(&mut connection, &event, id, aggregate, tenant, PAYOUT_PAID).await
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
        rows::payout_page(rows, page.limit).map(Some)
    }

    async fn funds(&self, tenant: &TenantId) -> Result<Vec<Funds>, StoreError> {
        let mut connection = self.acquire().await?;
        let rows: Vec<(String, i64, i64)> = Sql::new(FUNDS)
            .bind(tenant.as_str())
            .bind(None::<&str>)
            .fetch_all(&mut connection.connection())
            .await?;
        rows.into_iter().map(rows::funds_from_row).collect()
    }
}
