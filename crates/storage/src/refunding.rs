//! `RefundRepository`, written once for both backends over any [`SqlStore`], with the same
//! statements on PostgreSQL and SQLite but for what each backend's [`Dialect`] supplies (the
//! clock, the row lock, the time binding, the order a ledger transaction is sealed in).
//!
//! A refund's row has the id of its record's generation. While pending, it is the refund's
//! reservation on its charge (`charges.amount_reserved`) and on the tenant's balance (judged
//! under its lock, `holding.rs`); the finish makes it succeeded, and a definitive failure
//! deletes it and gives its amount back to the charge, in the transaction the engine ends the
//! record in either way.

use crate::StoreError;
use crate::Transaction;
use crate::dialect::{Dialect, Statement};
use crate::holding;
use crate::model::{ListRefunds, Owner, RefundPage, RefundRefusal, Reservation};
use crate::posting::{self, Posted};
use crate::reading;
use crate::repository::RefundRepository;
use crate::rows::{self, RefundRow, RefundableRow, ReservedRow};
use crate::sql_store::SqlStore;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{
    LedgerTransaction, PAYMENT_REFUNDED, PaymentRefunded, Refund, RefundId, RefundRequest,
    RefundStatus, TenantId,
};

/// The columns of a `refunds` row ([`RefundRow`]).
const SELECT_REFUNDS: &str = "SELECT id, tenant_id, charge_id, amount, currency, reason, \
                              processor_refund_id, created_at FROM refunds";

/// A refund row with the processor's id of its charge ([`ReservedRow`]).
const SELECT_RESERVED: &str = "SELECT r.id AS id, r.tenant_id AS tenant_id, \
     r.charge_id AS charge_id, r.amount AS amount, r.currency AS currency, r.reason AS reason, \
     r.processor_refund_id AS processor_refund_id, r.created_at AS created_at, \
     c.processor_charge_id AS charge_processor_id \
     FROM refunds r JOIN charges c ON c.id = r.charge_id WHERE r.id = ";

/// The reversing ledger transaction of `refund` and its `payment.refunded` event, on the
/// caller's transaction.
async fn post_refund<DB: Dialect>(
    connection: &mut DB::Connection,
    refund: &Refund,
) -> Result<(), StoreError> {
    let tenant = refund.tenant.as_str();
    let posted = Posted::Refund {
        charge: refund.charge.as_uuid(),
        refund: refund.id.as_uuid(),
    };
    let ledger = LedgerTransaction::for_refund(refund);
    posting::post_ledger::<DB>(&mut *connection, &ledger, tenant, posted).await?;
    let event = PaymentRefunded::for_refund(refund);
    let (id, aggregate) = (event.event_id, refund.id.as_uuid());
    posting::insert_event::<DB>(connection, &event, id, aggregate, tenant, PAYMENT_REFUNDED).await
}

#[async_trait]
impl<S: SqlStore> RefundRepository for S {
    async fn reserve_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &RefundRequest,
        created_at: DateTime<Utc>,
    ) -> Result<Reservation, StoreError> {
        let write = S::write_in(transaction)?;
        let mut made = Statement::<S::Db>::new(SELECT_RESERVED);
        made.value(owner.fence.generation);
        let made: Option<ReservedRow> = made.fetch_optional(write).await?;
        if let Some(made) = made {
            return Ok(Reservation::Reserved {
                refund: made.refund.into_refund()?,
                processor_charge_id: made.charge_processor_id,
            });
        }
        let mut charge = Statement::<S::Db>::new(
            "SELECT amount, currency, amount_reserved, processor_charge_id
             FROM charges WHERE tenant_id = ",
        );
        charge
            .value(owner.scope.tenant.as_str())
            .push(" AND id = ")
            .value(request.charge.as_uuid())
            .push(S::Db::LOCK_ROW);
        let charge: Option<RefundableRow> = charge.fetch_optional(write).await?;
        let Some(charge) = charge else {
            return Ok(Reservation::Refused(RefundRefusal::NoSuchCharge));
        };
        let amount =
            match RefundRefusal::judge(charge.amount, charge.amount_reserved, request.amount) {
                Ok(amount) => amount,
                Err(refusal) => return Ok(Reservation::Refused(refusal)),
            };
        let money = rows::money(amount.minor_units(), &charge.currency)?;
        // The charge allows it; the balance must too, or payouts would lose what they hold.
        let tenant = owner.scope.tenant.as_str();
        let available = holding::lock_available::<S::Db>(write, tenant, money.currency).await?;
        if amount.minor_units() > available {
            let refusal = RefundRefusal::InsufficientBalance { available };
            return Ok(Reservation::Refused(refusal));
        }
        let refund = Refund {
            id: RefundId::from_uuid(owner.fence.generation),
            tenant: TenantId::new(owner.scope.tenant.clone()),
            charge: request.charge,
            money,
            reason: request.reason,
            status: RefundStatus::Pending,
            created_at,
        };
        let mut reserve =
            Statement::<S::Db>::new("UPDATE charges SET amount_reserved = amount_reserved + ");
        reserve
            .value(amount.minor_units())
            .push(" WHERE id = ")
            .value(refund.charge.as_uuid());
        reserve.execute(write).await?;
        let mut insert = Statement::<S::Db>::new(
            "INSERT INTO refunds
                 (id, charge_id, tenant_id, currency, reason, amount, status, created_at)
             VALUES (",
        );
        insert
            .values([refund.id.as_uuid(), refund.charge.as_uuid()])
            .push(", ")
            .values([refund.tenant.as_str(), money.currency.code()])
            .push(", ")
            .value(refund.reason.map(|r| r.name()))
            .push(", ")
            .value(amount.minor_units())
            .push(", 'pending', ");
        S::Db::push_time(&mut insert, created_at);
        insert.push(")");
        insert.execute(write).await?;
        Ok(Reservation::Reserved {
            refund,
            processor_charge_id: charge.processor_charge_id,
        })
    }

    async fn finish_refund(
        &self,
        transaction: &mut Transaction,
        refund: &Refund,
    ) -> Result<(), StoreError> {
        let RefundStatus::Succeeded {
            processor_refund_id,
        } = &refund.status
        else {
            return Err(StoreError::Corrupt(format!(
                "refund {} finished without a processor refund",
                refund.id
            )));
        };
        let write = S::write_in(transaction)?;
        let mut succeed = Statement::<S::Db>::new(
            "UPDATE refunds SET status = 'succeeded', processor_refund_id = ",
        );
        succeed
            .value(processor_refund_id.as_str())
            .push(" WHERE id = ")
            .value(refund.id.as_uuid())
            .push(" AND status = 'pending'");
        if succeed.execute(write).await? != 1 {
            return Err(StoreError::Corrupt(format!(
                "refund {} has no reservation to finish",
                refund.id
            )));
        }
        let mut refunded =
            Statement::<S::Db>::new("UPDATE charges SET amount_refunded = amount_refunded + ");
        refunded
            .value(refund.money.amount.minor_units())
            .push(" WHERE id = ")
            .value(refund.charge.as_uuid());
        refunded.execute(write).await?;
        post_refund::<S::Db>(write, refund).await
    }

    /// Deletes the pending refund and gives its amount back to its charge. Nothing to do when
    /// the generation reserved nothing.
    async fn release_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError> {
        let write = S::write_in(transaction)?;
        let mut delete = Statement::<S::Db>::new("DELETE FROM refunds WHERE id = ");
        delete
            .value(owner.fence.generation)
            .push(" AND status = 'pending' RETURNING charge_id, amount");
        let released: Option<(uuid::Uuid, i64)> = delete.fetch_optional(&mut *write).await?;
        if let Some((charge, amount)) = released {
            let mut give_back =
                Statement::<S::Db>::new("UPDATE charges SET amount_reserved = amount_reserved - ");
            give_back.value(amount).push(" WHERE id = ").value(charge);
            give_back.execute(write).await?;
        }
        Ok(())
    }

    async fn get_refund(
        &self,
        tenant: &TenantId,
        id: RefundId,
    ) -> Result<Option<Refund>, StoreError> {
        let mut sql = Statement::<S::Db>::new(SELECT_REFUNDS);
        reading::push_tenants_id(&mut sql, tenant, id.as_uuid());
        let mut connection = self.pool().acquire().await?;
        let row: Option<RefundRow> = sql.fetch_optional(&mut connection).await?;
        row.map(RefundRow::into_refund).transpose()
    }

    async fn list_refunds(
        &self,
        tenant: &TenantId,
        page: ListRefunds,
    ) -> Result<Option<RefundPage>, StoreError> {
        let cursor = match page.starting_after {
            Some(id) => match self.get_refund(tenant, id).await? {
                Some(refund) if refund.charge == page.charge => Some(refund),
                _ => return Ok(None),
            },
            None => None,
        };
        let mut sql = Statement::<S::Db>::new(SELECT_REFUNDS);
        let charge = Some(("charge_id", page.charge.as_uuid()));
        let cursor = cursor.map(|c| (c.created_at, c.id.as_uuid()));
        reading::push_page(&mut sql, tenant, charge, cursor, page.limit);
        let mut connection = self.pool().acquire().await?;
        let rows = sql.fetch_all(&mut connection).await?;
        rows::refund_page(rows, page.limit).map(Some)
    }
}
