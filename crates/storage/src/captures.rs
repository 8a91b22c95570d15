//! Holds: a charge made with `"capture": false`, its capture and its cancel. Plain functions on
//! the transaction the engine begins over the operation's record, each a whole statement for
//! both backends (or the two side by side).
//!
//! A hold's row is a charge whose `capture_status` is `requires_capture` (the captures
//! migration says what each column means). It posts nothing to the ledger: held money is no
//! one's yet, and the funds show it apart as `authorized`. Its capture posts what it took as a
//! charge captured at once posts its amount (the charge's one ledger transaction), with
//! `payment.completed`; its cancel posts nothing, with `payment.canceled`. Each moves the row
//! out of `requires_capture` only if it is still there: the processor lets exactly one of a
//! capture and a void happen, and the row agrees with it or the finish fails.

use chrono::{DateTime, Utc};
use payments_domain::{
    CancellationReason, Capture, Charge, ChargeId, LedgerTransaction, Money, PAYMENT_AUTHORIZED,
    PAYMENT_CANCELED, PAYMENT_COMPLETED, PaymentAuthorized, PaymentCanceled, PaymentCompleted,
    TenantId,
};
use uuid::Uuid;

use crate::Owner;
use crate::charges::ChargeRow;
use crate::posting;
use crate::rows::corrupt;
use crate::sql::{Each, Sql};
use crate::{StoreError, Transaction};

/// A hold (`$1`..`$9`, `$9` its `capture_before`) and its `payment.authorized` event (`$10`
/// of type `$11`, payload `$12`).
const INSERT_HOLD: Each = Each {
    postgres: "
WITH charge AS (
    INSERT INTO charges (id, tenant_id, amount, currency, source, description, status,
                         processor_charge_id, created_at, capture_status, capture_before)
    VALUES ($1, $2, $3, $4, $5, $6, 'succeeded', $7, $8, 'requires_capture', $9)
    RETURNING id, tenant_id
)
INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
SELECT $10, charge.tenant_id, $11, charge.id, $12 FROM charge",
    sqlite: "
INSERT INTO charges
    (id, tenant_id, amount, currency, source, description, status, processor_charge_id,
     created_at, capture_status, capture_before)
VALUES ($1, $2, $3, $4, $5, $6, 'succeeded', $7, $8, 'requires_capture', $9);

INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($10, $1, $2, $11, $12, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
};

/// Writes a hold and its `payment.authorized` event in `transaction`, begun over its record.
pub async fn insert_hold(transaction: &mut Transaction, charge: &Charge) -> Result<(), StoreError> {
    let Capture::Manual { capture_before, .. } = charge.capture else {
        return Err(StoreError::Corrupt(format!(
            "charge {} is not a hold: it was captured when it was made",
            charge.id
        )));
    };
    let event = PaymentAuthorized::for_authorization(charge);
    Sql::new(INSERT_HOLD)
        .bind(charge.id.as_uuid())
        .bind(charge.tenant.as_str())
        .bind(charge.money.amount.minor_units())
        .bind(charge.money.currency.code())
        .bind(charge.source.as_str())
        .bind(charge.description.as_ref().map(|d| d.as_str()))
        .bind(charge.processor_charge_id.as_str())
        .bind(charge.created_at)
        .bind(capture_before)
        .bind(event.event_id)
        .bind(PAYMENT_AUTHORIZED)
        .bind(posting::payload(&event)?)
        .execute(&mut transaction.connection())
        .await?;
    Ok(())
}

/// The tenant's charge `$2` with its hold's claim, locked until the commit on PostgreSQL
/// (SQLite's write transaction holds the whole database already), so that what a capture or a
/// cancel judges of it stays true until its record is written.
const LOCKED_CHARGE: Each = Each {
    postgres: "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded, capture_status, capture_before, amount_captured, cancellation_reason,
       hold_claimed_by, hold_claimed_for
FROM charges WHERE tenant_id = $1 AND id = $2
FOR NO KEY UPDATE",
    sqlite: "
SELECT id, tenant_id, amount, currency, source, description, processor_charge_id, created_at,
       amount_refunded, capture_status, capture_before, amount_captured, cancellation_reason,
       hold_claimed_by, hold_claimed_for
FROM charges WHERE tenant_id = $1 AND id = $2",
};

/// A charge row with its hold's claim.
#[derive(Debug, sqlx::FromRow)]
struct ClaimRow {
    #[sqlx(flatten)]
    charge: ChargeRow,
    hold_claimed_by: Option<Uuid>,
    hold_claimed_for: Option<String>,
}

/// Claims the hold `$1` for the generation `$2`, for `$3`.
const CLAIM_HOLD: &str = "
UPDATE charges SET hold_claimed_by = $2, hold_claimed_for = $3
WHERE id = $1 AND hold_claimed_by IS NULL";

/// Releases whatever the generation `$1` claims, of a hold still held.
const RELEASE_HOLD: &str = "
UPDATE charges SET hold_claimed_by = NULL, hold_claimed_for = NULL
WHERE hold_claimed_by = $1 AND capture_status = 'requires_capture'";

/// What ends a hold: its capture or its cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    Capture,
    Cancel,
}

impl HoldEnd {
    fn name(self) -> &'static str {
        match self {
            Self::Capture => "capture",
            Self::Cancel => "cancel",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Capture, Self::Cancel]
            .into_iter()
            .find(|end| end.name() == name)
    }
}

/// What claiming a hold came to.
#[derive(Debug, Clone)]
pub enum HoldClaim<R> {
    /// The hold is claimed for the generation: now, or by an earlier attempt of it, whatever
    /// the hold's state and time have become since.
    Claimed(Charge),
    /// The tenant has no such charge.
    NoSuchCharge,
    /// The charge's state refuses it (`may_claim`'s refusal).
    Refused(R),
    /// Another generation claimed it, for a capture or a cancel that is at work or has ended
    /// it.
    ClaimedByAnother(HoldEnd),
}

/// Claims the tenant's hold `charge` for the generation `owner` holds, to `end` it, in
/// `transaction`, begun over its record, unless `may_claim` refuses what the charge has become.
/// Idempotent per generation: a claim the generation made already stands, so that every
/// attempt of it prepares what the first did (its effect may exist).
pub async fn claim_hold<R>(
    transaction: &mut Transaction,
    owner: Owner<'_>,
    charge: ChargeId,
    end: HoldEnd,
    may_claim: impl FnOnce(&Charge) -> Result<(), R>,
) -> Result<HoldClaim<R>, StoreError> {
    let mut connection = transaction.connection();
    let row: Option<ClaimRow> = Sql::new(LOCKED_CHARGE)
        .bind(owner.scope.tenant.as_str())
        .bind(charge.as_uuid())
        .fetch_optional(&mut connection)
        .await?;
    let Some(row) = row else {
        return Ok(HoldClaim::NoSuchCharge);
    };
    let generation = owner.fence.generation;
    let (claimed_by, claimed_for) = (row.hold_claimed_by, row.hold_claimed_for.clone());
    let charge = row.charge.into_charge()?;
    if claimed_by == Some(generation) {
        return Ok(HoldClaim::Claimed(charge));
    }
    if let Err(refusal) = may_claim(&charge) {
        return Ok(HoldClaim::Refused(refusal));
    }
    if let Some(claimed_for) = claimed_for {
        let other = HoldEnd::from_name(&claimed_for)
            .ok_or_else(|| corrupt("hold_claimed_for", &claimed_for))?;
        return Ok(HoldClaim::ClaimedByAnother(other));
    }
    let claimed = Sql::new(CLAIM_HOLD)
        .bind(charge.id.as_uuid())
        .bind(generation)
        .bind(end.name())
        .execute(&mut connection)
        .await?;
    if claimed != 1 {
        return Err(StoreError::Corrupt(format!(
            "charge {} could not be claimed, though it was read unclaimed under its lock",
            charge.id
        )));
    }
    Ok(HoldClaim::Claimed(charge))
}

/// Releases the hold the generation `owner` holds claimed, if it is still held, in
/// `transaction`, begun over its record, which ends without a capture or a void.
pub async fn release_hold(
    transaction: &mut Transaction,
    owner: Owner<'_>,
) -> Result<(), StoreError> {
    Sql::new(RELEASE_HOLD)
        .bind(owner.fence.generation)
        .execute(&mut transaction.connection())
        .await?;
    Ok(())
}

/// Ends a hold as captured for `$2` by the processor's capture `$3` at `$4`, if it is still
/// held.
const CAPTURE_HOLD: &str = "
UPDATE charges
SET capture_status = 'captured', amount_captured = $2, processor_capture_id = $3,
    hold_ended_at = $4
WHERE id = $1 AND capture_status = 'requires_capture'";

/// Ends a hold as canceled for the reason `$2` by the processor's void `$3` at `$4`, if it is
/// still held.
const CANCEL_HOLD: &str = "
UPDATE charges
SET capture_status = 'canceled', cancellation_reason = $2, processor_void_id = $3,
    hold_ended_at = $4
WHERE id = $1 AND capture_status = 'requires_capture'";

/// What a capture posts: the charge's (`$2`, of the tenant `$3`) ledger transaction `$1` with
/// its entries (the JSON array `$4`), and its `payment.completed` event (`$5` of type `$6`,
/// payload `$7`). One statement on PostgreSQL; one script on SQLite, whose entries go before
/// their transaction's row, which seals them.
const POST_CAPTURE: Each = Each {
    postgres: "
WITH ledger AS (
    INSERT INTO ledger_transactions (id, charge_id, tenant_id, created_at)
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

INSERT INTO ledger_transactions (id, charge_id, tenant_id, created_at)
VALUES ($1, $2, $3, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));

INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($5, $2, $3, $6, $7, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
};

/// An outbox event of a hold's end (`$1` of type `$4`, payload `$5`, of the charge `$2` of the
/// tenant `$3`).
const INSERT_EVENT: Each = Each {
    postgres: "
INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($1, $2, $3, $4, $5, now())",
    sqlite: "
INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($1, $2, $3, $4, $5, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
};

/// Ends the hold `charge` as captured for `captured` by the processor's capture
/// `processor_capture_id`, in `transaction`, begun over the capture's record: the charge's row,
/// its ledger transaction and `payment.completed`.
pub async fn capture_hold(
    transaction: &mut Transaction,
    charge: &Charge,
    captured: Money,
    processor_capture_id: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let mut connection = transaction.connection();
    let ended = Sql::new(CAPTURE_HOLD)
        .bind(charge.id.as_uuid())
        .bind(captured.amount.minor_units())
        .bind(processor_capture_id)
        .bind(at)
        .execute(&mut connection)
        .await?;
    if ended != 1 {
        return Err(no_longer_held(charge.id));
    }
    let ledger = LedgerTransaction::for_capture(captured);
    let event = PaymentCompleted::for_capture(charge, captured, at);
    Sql::new(POST_CAPTURE)
        .bind(ledger.id())
        .bind(charge.id.as_uuid())
        .bind(charge.tenant.as_str())
        .bind(posting::entries(&ledger))
        .bind(event.event_id)
        .bind(PAYMENT_COMPLETED)
        .bind(posting::payload(&event)?)
        .execute(&mut connection)
        .await?;
    Ok(())
}

/// Ends the hold `charge` as canceled by the processor's void `processor_void_id`, in
/// `transaction`, begun over the cancel's record: the charge's row and `payment.canceled`.
/// Nothing is posted: nothing was taken.
pub async fn cancel_hold(
    transaction: &mut Transaction,
    charge: &Charge,
    reason: Option<CancellationReason>,
    processor_void_id: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let mut connection = transaction.connection();
    let ended = Sql::new(CANCEL_HOLD)
        .bind(charge.id.as_uuid())
        .bind(reason.map(CancellationReason::name))
        .bind(processor_void_id)
        .bind(at)
        .execute(&mut connection)
        .await?;
    if ended != 1 {
        return Err(no_longer_held(charge.id));
    }
    let event = PaymentCanceled::for_cancel(charge, reason, at);
    Sql::new(INSERT_EVENT)
        .bind(event.event_id)
        .bind(charge.id.as_uuid())
        .bind(charge.tenant.as_str())
        .bind(PAYMENT_CANCELED)
        .bind(posting::payload(&event)?)
        .execute(&mut connection)
        .await?;
    Ok(())
}

/// The processor let the capture or the void happen, so the hold must still be held: a row
/// that says otherwise disagrees with it, and nothing is written.
fn no_longer_held(id: ChargeId) -> StoreError {
    StoreError::Corrupt(format!(
        "charge {id} is no longer held, yet the processor ended its hold now"
    ))
}

/// Up to `$2` holds whose `capture_before` is before `$1` and that no capture or cancel claims,
/// the longest past first.
const EXPIRED_HOLDS: &str = "
SELECT tenant_id, id FROM charges
WHERE capture_status = 'requires_capture' AND capture_before < $1
  AND hold_claimed_by IS NULL
ORDER BY capture_before LIMIT $2";

/// Up to `limit` holds past their `capture_before` at `now` that no capture or cancel claims,
/// as (tenant, charge), read in `transaction`. A claimed hold is left to its claim: if that
/// ends it, it is ended; if not, the claim is released and a later round finds it.
pub async fn expired_holds(
    transaction: &mut Transaction,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<(TenantId, ChargeId)>, StoreError> {
    let rows: Vec<(String, Uuid)> = Sql::new(EXPIRED_HOLDS)
        .bind(now)
        .bind(limit)
        .fetch_all(&mut transaction.connection())
        .await?;
    Ok(rows
        .into_iter()
        .map(|(tenant, id)| (TenantId::new(tenant), ChargeId::from_uuid(id)))
        .collect())
}
