//! `PayoutRepository`, written once for both backends over any [`SqlStore`].
//!
//! A payout's row has the id of its record's generation. While pending, it is the payout's
//! reservation on the tenant's balance, made under the balance's lock (`holding.rs`) before the
//! processor is called; the finish makes it paid and posts it, and a definitive failure deletes
//! it, in the transaction the engine ends the record in either way.

use crate::StoreError;
use crate::Transaction;
use crate::dialect::{Dialect, Statement};
use crate::holding;
use crate::model::{Funds, ListPayouts, Owner, PayoutPage, PayoutReservation};
use crate::posting::{self, Posted};
use crate::reading;
use crate::repository::PayoutRepository;
use crate::rows::{self, PayoutRow};
use crate::sql_store::SqlStore;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{
    LedgerTransaction, PAYOUT_PAID, Payout, PayoutId, PayoutPaid, PayoutRequest, PayoutStatus,
    TenantId,
};

/// The columns of a `payouts` row ([`PayoutRow`]).
const SELECT_PAYOUTS: &str = "SELECT id, tenant_id, amount, currency, destination, description, \
                              processor_payout_id, created_at FROM payouts";

/// The ledger transaction of `payout` and its `payout.paid` event, on the caller's
/// transaction.
async fn post_payout<DB: Dialect>(
    connection: &mut DB::Connection,
    payout: &Payout,
) -> Result<(), StoreError> {
    let tenant = payout.tenant.as_str();
    let posted = Posted::Payout(payout.id.as_uuid());
    let ledger = LedgerTransaction::for_payout(payout);
    posting::post_ledger::<DB>(&mut *connection, &ledger, tenant, posted).await?;
    let event = PayoutPaid::for_payout(payout);
    let (id, aggregate) = (event.event_id, payout.id.as_uuid());
    posting::insert_event::<DB>(connection, &event, id, aggregate, tenant, PAYOUT_PAID).await
}

#[async_trait]
impl<S: SqlStore> PayoutRepository for S {
    async fn reserve_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &PayoutRequest,
        created_at: DateTime<Utc>,
    ) -> Result<PayoutReservation, StoreError> {
        let write = S::write_in(transaction)?;
        let mut made = Statement::<S::Db>::new(SELECT_PAYOUTS);
        made.push(" WHERE id = ").value(owner.fence.generation);
        let made: Option<PayoutRow> = made.fetch_optional(&mut *write).await?;
        if let Some(made) = made {
            return Ok(PayoutReservation::Reserved(made.into_payout()?));
        }
        let tenant = owner.scope.tenant.as_str();
        let money = request.money;
        let available =
            holding::lock_available::<S::Db>(&mut *write, tenant, money.currency).await?;
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
        let mut insert = Statement::<S::Db>::new(
            "INSERT INTO payouts
                 (id, tenant_id, amount, currency, destination, description, status, created_at)
             VALUES (",
        );
        insert
            .value(payout.id.as_uuid())
            .push(", ")
            .value(tenant)
            .push(", ")
            .value(money.amount.minor_units())
            .push(", ")
            .values([money.currency.code(), payout.destination.as_str()])
            .push(", ")
            .value(payout.description.as_ref().map(|d| d.as_str()))
            .push(", 'pending', ");
        S::Db::push_time(&mut insert, created_at);
        insert.push(")");
        insert.execute(write).await?;
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
        let write = S::write_in(transaction)?;
        let mut paid =
            Statement::<S::Db>::new("UPDATE payouts SET status = 'paid', processor_payout_id = ");
        paid.value(processor_payout_id.as_str())
            .push(" WHERE id = ")
            .value(payout.id.as_uuid())
            .push(" AND status = 'pending'");
        if paid.execute(&mut *write).await? != 1 {
            return Err(StoreError::Corrupt(format!(
                "payout {} has no reservation to finish",
                payout.id
            )));
        }
        post_payout::<S::Db>(write, payout).await
    }

    /// Deletes the pending payout, whose amount the balance counted as held. Nothing to do
    /// when the generation reserved nothing.
    async fn release_payout(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError> {
        let mut delete = Statement::<S::Db>::new("DELETE FROM payouts WHERE id = ");
        delete
            .value(owner.fence.generation)
            .push(" AND status = 'pending'");
        delete.execute(S::write_in(transaction)?).await?;
        Ok(())
    }

    async fn get_payout(
        &self,
        tenant: &TenantId,
        id: PayoutId,
    ) -> Result<Option<Payout>, StoreError> {
        let mut sql = Statement::<S::Db>::new(SELECT_PAYOUTS);
        reading::push_tenants_id(&mut sql, tenant, id.as_uuid());
        let mut connection = self.pool().acquire().await?;
        let row: Option<PayoutRow> = sql.fetch_optional(&mut connection).await?;
        row.map(PayoutRow::into_payout).transpose()
    }

    async fn list_payouts(
        &self,
        tenant: &TenantId,
        page: ListPayouts,
    ) -> Result<Option<PayoutPage>, StoreError> {
        let cursor = match page.starting_after {
            Some(id) => match self.get_payout(tenant, id).await? {
                Some(payout) => Some(payout),
                None => return Ok(None),
            },
            None => None,
        };
        let mut sql = Statement::<S::Db>::new(SELECT_PAYOUTS);
        let cursor = cursor.map(|c| (c.created_at, c.id.as_uuid()));
        reading::push_page(&mut sql, tenant, None, cursor, page.limit);
        let mut connection = self.pool().acquire().await?;
        let rows = sql.fetch_all(&mut connection).await?;
        rows::payout_page(rows, page.limit).map(Some)
    }

    async fn funds(&self, tenant: &TenantId) -> Result<Vec<Funds>, StoreError> {
        let mut connection = self.pool().acquire().await?;
        let rows: Vec<(String, i64, i64)> = holding::funds::<S::Db>(tenant.as_str(), None)
            .fetch_all(&mut connection)
            .await?;
        rows.into_iter().map(rows::funds_from_row).collect()
    }
}
