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
    Amount, ChargeId, LedgerTransaction, PAYMENT_REFUNDED, PaymentRefunded, Refund, RefundId,
    RefundReason, RefundRequest, RefundStatus, TenantId,
};

use payments_idempotency_sql::Connection;
use uuid::Uuid;

use crate::Owner;
use crate::database::DatabaseStore;
use crate::holding;
use crate::postgres;
use crate::posting;
use crate::rows::{corrupt, money, page};
use crate::sql::{Each, Sql};
use crate::{StoreError, Transaction};

/// Refunds: the reservation of a refund's amount on its charge, the fenced writes that end a
/// refund, and the reads. A refund's row has the id of its record's generation, so every
/// attempt of one generation finds the same reservation.
#[async_trait]
pub trait RefundRepository: Send + Sync {
    /// Reserves the refund's amount on its charge for the generation `owner` holds, in
    /// `transaction`, begun over its record: the charge's row is locked, so refunds of one
    /// charge under different keys reserve one after the other and never exceed it together.
    /// Idempotent per generation: a reservation the generation already made is returned as it
    /// is.
    async fn reserve_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        request: &RefundRequest,
        created_at: DateTime<Utc>,
    ) -> Result<Reservation, StoreError>;

    /// Writes each succeeded refund, its charge's refunded amount, its reversing ledger
    /// transaction and its `payment.refunded` outbox event in `transaction`, begun over the
    /// refunds' records (one, or a batch of finishes). Refunds of one charge add to its
    /// refunded amount in the order given. The rows are locked in one order whatever the order
    /// given, so two transactions finishing refunds never wait for each other in a circle:
    /// the charges first, by id, then the ledger's balances (storage.md's "Lock order").
    async fn finish_refunds(
        &self,
        transaction: &mut Transaction,
        refunds: &[&Refund],
    ) -> Result<(), StoreError>;

    /// Releases whatever the generation `owner` holds reserved, in `transaction`, begun over
    /// its record, which ends without a refund.
    async fn release_refund(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError>;

    /// The tenant's refund with this id; another tenant's refund is simply not found.
    async fn get_refund(
        &self,
        tenant: &TenantId,
        id: RefundId,
    ) -> Result<Option<Refund>, StoreError>;

    /// A page of the refunds of one of the tenant's charges, newest first, or `None` when the
    /// cursor is not one of that charge's refunds.
    async fn list_refunds(
        &self,
        tenant: &TenantId,
        page: ListRefunds,
    ) -> Result<Option<RefundPage>, StoreError>;
}

/// What reserving a refund's amount on its charge came to.
#[derive(Debug, Clone)]
pub enum Reservation {
    /// The refund's pending row, made now or by an earlier attempt of the same generation, and
    /// the processor's id of the charge it refunds.
    Reserved {
        refund: Refund,
        processor_charge_id: String,
    },
    /// A final answer that depends on the charge's state, not only on the request: nothing
    /// was reserved.
    Refused(RefundRefusal),
}

/// Why a refund cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundRefusal {
    /// The tenant has no such charge.
    NoSuchCharge,
    /// No amount was asked for, and nothing of the charge is left to refund.
    NothingLeft,
    /// The charge only holds its money (it was made with `"capture": false`) and was not
    /// captured: nothing of it was taken, so nothing can be given back.
    NotCaptured,
    /// The amount asked for is more than is left to refund (`refundable`, possibly 0).
    TooLarge { refundable: i64 },
    /// The refund would take more than the tenant's balance has available (what its pending
    /// reservations hold is not): only `available` is left in the charge's currency.
    InsufficientBalance { available: i64 },
}

impl RefundRefusal {
    /// The amount a refund of a charge of `amount`, of which `reserved` is already claimed by
    /// other refunds, may have: `requested`, or all that is left when none was asked for.
    pub fn judge(
        amount: i64,
        reserved: i64,
        requested: Option<Amount>,
    ) -> Result<Amount, RefundRefusal> {
        let left = amount - reserved;
        match requested {
            Some(requested) if requested.minor_units() > left => {
                Err(Self::TooLarge { refundable: left })
            }
            Some(requested) => Ok(requested),
            None => Amount::new(left).map_err(|_| Self::NothingLeft),
        }
    }
}

/// A page request for a charge's refunds: newest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListRefunds {
    pub charge: ChargeId,
    pub limit: u32,
    pub starting_after: Option<RefundId>,
}

/// One page of a charge's refunds, newest first.
#[derive(Debug, Clone)]
pub struct RefundPage {
    pub refunds: Vec<Refund>,
    pub has_more: bool,
}

/// A `refunds` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RefundRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub charge_id: Uuid,
    pub amount: i64,
    pub currency: String,
    pub reason: Option<String>,
    pub processor_refund_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl RefundRow {
    /// A refund is succeeded exactly when it has its processor refund id (the schema's
    /// `succeeded_has_processor_refund`), so the id alone gives the status.
    pub(crate) fn into_refund(self) -> Result<Refund, StoreError> {
        let reason = self
            .reason
            .map(|name| RefundReason::from_name(&name).ok_or_else(|| corrupt("reason", &name)))
            .transpose()?;
        Ok(Refund {
            id: RefundId::from_uuid(self.id),
            tenant: TenantId::new(self.tenant_id),
            charge: ChargeId::from_uuid(self.charge_id),
            money: money(self.amount, &self.currency)?,
            reason,
            status: match self.processor_refund_id {
                Some(processor_refund_id) => RefundStatus::Succeeded {
                    processor_refund_id,
                },
                None => RefundStatus::Pending,
            },
            created_at: self.created_at,
        })
    }
}

/// A pending refund and the processor's id of the charge it refunds.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ReservedRow {
    #[sqlx(flatten)]
    pub refund: RefundRow,
    pub charge_processor_id: String,
}

/// What a reservation reads of the charge it reserves on.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RefundableRow {
    pub amount: i64,
    pub currency: String,
    pub amount_reserved: i64,
    pub processor_charge_id: String,
    /// `None` for a charge captured when it was made.
    pub capture_status: Option<String>,
    pub amount_captured: Option<i64>,
}

impl RefundableRow {
    /// What refunds may draw on: the charge's amount, or what its capture took; a hold that is
    /// not captured (or was canceled) has nothing to give back.
    fn refundable(&self) -> Result<i64, RefundRefusal> {
        match (self.capture_status.as_deref(), self.amount_captured) {
            (None, _) => Ok(self.amount),
            (Some("captured"), Some(captured)) => Ok(captured),
            _ => Err(RefundRefusal::NotCaptured),
        }
    }
}

/// A page of refunds, like [`charge_page`].
fn refund_page(rows: Vec<RefundRow>, limit: u32) -> Result<RefundPage, StoreError> {
    let (refunds, has_more) = page(rows, limit, RefundRow::into_refund)?;
    Ok(RefundPage { refunds, has_more })
}

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
SELECT amount, currency, amount_reserved, processor_charge_id, capture_status,
       amount_captured
FROM charges WHERE tenant_id = $1 AND id = $2
FOR UPDATE",
    sqlite: "
SELECT amount, currency, amount_reserved, processor_charge_id, capture_status,
       amount_captured
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

/// What a succeeded refund (`$3`, of `$5` minor units of the charge `$2`, the tenant `$4`)
/// posts, in one round trip: the charge's refunded amount, the reversing ledger transaction
/// `$1` with its entries (the JSON array `$6`) and its `payment.refunded` event (`$7` of type
/// `$8`, payload `$9`). One statement on PostgreSQL, which checks the entries' balance at
/// commit; one script on SQLite, whose entries go before their transaction's row, which seals
/// them (the schema's trigger checks that they balance).
const POST_REFUND: Each = Each {
    postgres: "
WITH refunded AS (
    UPDATE charges SET amount_refunded = amount_refunded + $5 WHERE id = $2
),
ledger AS (
    INSERT INTO ledger_transactions (id, charge_id, refund_id, tenant_id, created_at)
    VALUES ($1, $2, $3, $4, now())
),
entries AS (
    INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
    SELECT $1, e.line, $4, e.entry ->> 'account', e.entry ->> 'currency',
           (e.entry ->> 'amount')::bigint
    FROM jsonb_array_elements($6) WITH ORDINALITY AS e(entry, line)
)
INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($7, $3, $4, $8, $9, now())",
    sqlite: "
UPDATE charges SET amount_refunded = amount_refunded + $5 WHERE id = $2;

INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
SELECT $1, e.key + 1, $4, e.value ->> 'account', e.value ->> 'currency', e.value ->> 'amount'
FROM json_each($6) AS e;

INSERT INTO ledger_transactions (id, charge_id, refund_id, tenant_id, created_at)
VALUES ($1, $2, $3, $4, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));

INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($7, $3, $4, $8, $9, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
};

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
        let judged = charge.refundable().and_then(|refundable| {
            RefundRefusal::judge(refundable, charge.amount_reserved, request.amount)
        });
        let amount = match judged {
            Ok(amount) => amount,
            Err(refusal) => return Ok(Reservation::Refused(refusal)),
        };
        let money = money(amount.minor_units(), &charge.currency)?;
        // The charge allows it; the balance must too, or the tenant's other reservations would
        // lose what they hold.
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

    async fn finish_refunds(
        &self,
        transaction: &mut Transaction,
        refunds: &[&Refund],
    ) -> Result<(), StoreError> {
        if let [_, _, ..] = refunds
            && let Connection::Postgres(connection) = transaction.connection()
        {
            let charges = refunds.iter().map(|refund| refund.charge.as_uuid());
            postgres::lock_charges(connection, charges.collect()).await?;
        }
        for refund in posting::in_balance_order(refunds, |r| (&r.tenant, r.money.currency)) {
            finish_refund(transaction, refund).await?;
        }
        Ok(())
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
        refund_page(rows, page.limit).map(Some)
    }
}

/// One succeeded refund's rows, as [`RefundRepository::finish_refunds`] writes each.
async fn finish_refund(transaction: &mut Transaction, refund: &Refund) -> Result<(), StoreError> {
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
    let ledger = LedgerTransaction::for_refund(refund);
    let event = PaymentRefunded::for_refund(refund);
    Sql::new(POST_REFUND)
        .bind(ledger.id())
        .bind(refund.charge.as_uuid())
        .bind(refund.id.as_uuid())
        .bind(refund.tenant.as_str())
        .bind(refund.money.amount.minor_units())
        .bind(posting::entries(&ledger))
        .bind(event.event_id)
        .bind(PAYMENT_REFUNDED)
        .bind(posting::payload(&event)?)
        .execute(&mut connection)
        .await?;
    Ok(())
}

#[cfg(test)]
mod refund_tests {
    use super::*;

    fn amount(minor_units: i64) -> Amount {
        Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_refund_gets_what_it_asks_for_while_enough_is_left() {
        assert_eq!(
            RefundRefusal::judge(1000, 300, Some(amount(700))),
            Ok(amount(700))
        );
        assert_eq!(
            RefundRefusal::judge(1000, 300, Some(amount(701))),
            Err(RefundRefusal::TooLarge { refundable: 700 })
        );
    }

    #[test]
    fn a_refund_without_an_amount_takes_all_that_is_left() {
        assert_eq!(RefundRefusal::judge(1000, 300, None), Ok(amount(700)));
        assert_eq!(
            RefundRefusal::judge(1000, 1000, None),
            Err(RefundRefusal::NothingLeft)
        );
    }

    #[test]
    fn an_amount_asked_of_a_charge_with_nothing_left_is_too_large() {
        assert_eq!(
            RefundRefusal::judge(1000, 1000, Some(amount(1))),
            Err(RefundRefusal::TooLarge { refundable: 0 })
        );
    }
}
