//! `RefundRepository`.
//!
//! A refund's row has the id of its record's generation. While pending, it is the refund's
//! reservation on its charge (`charges.amount_reserved`) and on the tenant's balance (judged
//! under its lock, `holding.rs`); the finish makes it succeeded, and a definitive failure
//! deletes it and gives its amount back to the charge, in the transaction the engine ends the
//! record in either way.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{
    LedgerTransaction, PAYMENT_REFUNDED, PaymentRefunded, Refund, RefundId, RefundRequest,
    RefundStatus, TenantId,
};

use crate::holding;
use crate::model::{ListRefunds, Owner, RefundPage, RefundRefusal, Reservation};
use crate::posting::{self, Posted};
use crate::repository::RefundRepository;
use crate::rows::{self, RefundRow, RefundableRow, ReservedRow};
use crate::sql::{Each, Sql};
use crate::store::DatabaseStore;
use crate::{StoreError, Transaction};

/// The refund a generation (`$1`) reserved, if it did, with the processor's id of its charge.
const RESERVED_REFUND: &str = "
SELECT r.id AS id, r.tenant_id AS tenant_id, r.charge_id AS charge_id, r.amount AS amount,
       r.currency AS currency, r.reason AS reason, r.processor_refund_id AS processor_refund_id,
       r.created_at AS created_at, c.processor_charge_id AS charge_processor_id
FROM refunds r JOIN charges c ON c.id = r.charge_id
WHERE r.id = $1";

/// The tenant's charge a refund is for, locked until the commit, so that refunds of one
/// charge under different keys reserve one after the other (SQLite's write transaction
/// holds the whole database already).
const REFUNDABLE_CHARGE: Each = Each {
    postgres: "
SELECT amount, currency, amount_reserved, processor_charge_id
FROM charges WHERE tenant_id = $1 AND id = $2
FOR UPDATE",
    sqlite: "
SELECT amount, currency, amount_reserved, processor_charge_id
FROM charges WHERE tenant_id = $1 AND id = $2",
};

const RESERVE_ON_CHARGE: &str =
    "UPDATE charges SET amount_reserved = amount_reserved + $2 WHERE id = $1";

const INSERT_PENDING_REFUND: &str = "
INSERT INTO refunds (id, charge_id, tenant_id, currency, reason, amount, status, created_at)
VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7)";

const SUCCEED_REFUND: &str = "
UPDATE refunds SET status = 'succeeded', processor_refund_id = $2
WHERE id = $1 AND status = 'pending'";

const ADD_REFUNDED: &str =
    "UPDATE charges SET amount_refunded = amount_refunded + $2 WHERE id = $1";

const DELETE_PENDING_REFUND: &str = "
DELETE FROM refunds WHERE id = $1 AND status = 'pending'
RETURNING charge_id, amount";

const GIVE_BACK_TO_CHARGE: &str =
    "UPDATE charges SET amount_reserved = amount_reserved - $2 WHERE id = $1";

const REFUND: &str = "
SELECT id, tenant_id, charge_id, amount, currency, reason, processor_refund_id, created_at
FROM refunds WHERE tenant_id = $1 AND id = $2";

const REFUNDS: &str = "
SELECT id, tenant_id, charge_id, amount, currency, reason, processor_refund_id, created_at
FROM refunds WHERE tenant_id = $1 AND charge_id = $2
ORDER BY created_at DESC, id DESC LIMIT $3";

const REFUNDS_AFTER: &str = "
SELECT id, tenant_id, charge_id, amount, currency, reason, processor_refund_id, created_at
FROM refunds WHERE tenant_id = $1 AND charge_id = $2 AND (created_at, id) < ($3, $4)
ORDER BY created_at DESC, id DESC LIMIT $5";

#[async_trait]
impl RefundRepository for DatabaseStore {
    async fn reserve_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &RefundRequest,
        created_at: DateTime<Utc>,
    ) -> Result<Reservation, StoreError> {
        let mut connection = transaction.connection();
        let made: Option<ReservedRow> = Sql::new(RESERVED_REFUND)
            .bind(owner.fence.generation)
            .fetch_optional(&mut connection)
            .await?;
        if let Some(made) = made {
            return Ok(Reservation::Reserved {
                refund: made.refund.into_refund()?,
                processor_charge_id: made.charge_processor_id,
            });
        }
        let tenant = owner.scope.tenant.as_str();
        let charge: Option<RefundableRow> = Sql::new(REFUNDABLE_CHARGE)
            .bind(tenant)
            .bind(request.charge.as_uuid())
            .fetch_optional(&mut connection)
            .await?;
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
        let available = holding::lock_available(&mut connection, tenant, money.currency).await?;
        if amount.minor_units() > available {
            let refusal = RefundRefusal::InsufficientBalance { available };
            return Ok(Reservation::Refused(refusal));
        }
        let refund = Refund {
            id: RefundId::from_uuid(owner.fence.generation),
            tenant: TenantId::new(tenant),
            charge: request.charge,
            money,
            reason: request.reason,
            status: RefundStatus::Pending,
            created_at,
        };
        Sql::new(RESERVE_ON_CHARGE)
            .bind(refund.charge.as_uuid())
            .bind(amount.minor_units())
            .execute(&mut connection)
            .await?;
        Sql::new(INSERT_PENDING_REFUND)
            .bind(refund.id.as_uuid())
            .bind(refund.charge.as_uuid())
            .bind(tenant)
            .bind(money.currency.code())
            .bind(refund.reason.map(|r| r.name()))
            .bind(amount.minor_units())
            .bind(created_at)
            .execute(&mut connection)
            .await?;
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
        let mut connection = transaction.connection();
        let succeeded = Sql::new(SUCCEED_REFUND)
            .bind(refund.id.as_uuid())
            .bind(processor_refund_id.as_str())
            .execute(&mut connection)
            .await?;
        if succeeded != 1 {
            return Err(StoreError::Corrupt(format!(
                "refund {} has no reservation to finish",
                refund.id
            )));
        }
        Sql::new(ADD_REFUNDED)
            .bind(refund.charge.as_uuid())
            .bind(refund.money.amount.minor_units())
            .execute(&mut connection)
            .await?;
        let tenant = refund.tenant.as_str();
        let posted = Posted::Refund {
            charge: refund.charge.as_uuid(),
            refund: refund.id.as_uuid(),
        };
        let ledger = LedgerTransaction::for_refund(refund);
        posting::post_ledger(&mut connection, &ledger, tenant, posted).await?;
        let event = PaymentRefunded::for_refund(refund);
        let (id, aggregate) = (event.event_id, refund.id.as_uuid());
        posting::insert_event(
            &mut connection,
            &event,
            id,
            aggregate,
            tenant,
            PAYMENT_REFUNDED,
        )
        .await
    }

    /// Deletes the pending refund and gives its amount back to its charge. Nothing to do when
    /// the generation reserved nothing.
    async fn release_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError> {
        let mut connection = transaction.connection();
        let released: Option<(uuid::Uuid, i64)> = Sql::new(DELETE_PENDING_REFUND)
            .bind(owner.fence.generation)
            .fetch_optional(&mut connection)
            .await?;
        if let Some((charge, amount)) = released {
            Sql::new(GIVE_BACK_TO_CHARGE)
                .bind(charge)
                .bind(amount)
                .execute(&mut connection)
                .await?;
        }
        Ok(())
    }

    async fn get_refund(
        &self,
        tenant: &TenantId,
        id: RefundId,
    ) -> Result<Option<Refund>, StoreError> {
        let mut connection = self.acquire().await?;
        let row: Option<RefundRow> = Sql::new(REFUND)
            .bind(tenant.as_str())
            .bind(id.as_uuid())
            .fetch_optional(&mut connection.connection())
            .await?;
        row.map(RefundRow::into_refund).transpose()
    }

    async fn list_refunds(
        &self,
        tenant: &TenantId,
        page: ListRefunds,
    ) -> Result<Option<RefundPage>, StoreError> {
        let charge = page.charge.as_uuid();
        let sql = match page.starting_after {
            None => Sql::new(REFUNDS).bind(tenant.as_str()).bind(charge),
            Some(id) => match self.get_refund(tenant, id).await? {
                Some(cursor) if cursor.charge == page.charge => Sql::new(REFUNDS_AFTER)
                    .bind(tenant.as_str())
                    .bind(charge)
                    .bind(cursor.created_at)
                    .bind(cursor.id.as_uuid()),
                _ => return Ok(None),
            },
        };
        let mut connection = self.acquire().await?;
        let rows = sql
            .bind(i64::from(page.limit) + 1)
            .fetch_all(&mut connection.connection())
            .await?;
        rows::refund_page(rows, page.limit).map(Some)
    }
}
