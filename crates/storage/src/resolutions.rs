//! `ResolutionRepository`: an operator's resolution of a reconciliation exception holds the
//! exception for its record's generation, as a refund holds its amount (`holding.rs`), and its
//! finish writes the resolution and what it posts, in the transaction the engine completes the
//! record in.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{Charge, ExceptionId, Money, ResolutionAction, ResolutionNote, TenantId};
use payments_idempotency::{IdempotencyKey, Scope, StoredResponse};
use payments_idempotency_sql::Connection;

use crate::Owner;
use crate::charges::ChargeRepository;
use crate::database::DatabaseStore;
use crate::reconciliation::{EXCEPTION, ExceptionRow, ExceptionStatus, ReconciliationException};
use crate::sql::Sql;
use crate::{StoreError, Transaction};

/// Resolving reconciliation exceptions: the resolution operation's hold on
/// its exception, its finish, and its end without an effect. Like reconciliation, an
/// operator's job across tenants.
#[async_trait]
pub trait ResolutionRepository: Send + Sync {
    /// Holds the exception `id` for the generation `owner` holds, in `transaction`, begun over
    /// its record, so that resolutions under other keys find it held and change nothing.
    /// Idempotent per generation.
    async fn hold_exception(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        id: ExceptionId,
    ) -> Result<ExceptionHold, StoreError>;

    /// Writes the resolution, marks its exception resolved and writes what it posts, in
    /// `transaction`, begun over the resolution's record (`owner`).
    async fn finish_resolution(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        resolution: &NewResolution<'_>,
    ) -> Result<(), StoreError>;

    /// Lets go of the exception the generation `owner` held, in `transaction`, begun over its
    /// record, which ends without a resolution.
    async fn release_exception(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError>;
}

/// What holding an exception for a resolution found.
#[derive(Debug, Clone)]
pub enum ExceptionHold {
    /// The exception is open and now held by the resolution's generation (or was already).
    Held(Box<ReconciliationException>),
    /// It was resolved already: nothing more can change it.
    Resolved,
    /// Another resolution, under another key, is at work on it.
    HeldByAnother,
    /// No exception has that id.
    Missing,
}

/// A resolution to write in the transaction that completes its record.
#[derive(Debug, Clone, Copy)]
pub struct NewResolution<'a> {
    pub exception: ExceptionId,
    pub action: ResolutionAction,
    pub operator: &'a str,
    pub note: &'a ResolutionNote,
    /// The service's clock, as for the exceptions, so that a list of them pages on one form.
    pub resolved_at: DateTime<Utc>,
    pub posts: Posting<'a>,
}

/// What a resolution writes into the books besides itself.
#[derive(Debug, Clone, Copy)]
pub enum Posting<'a> {
    /// `accept`: nothing.
    Nothing,
    /// `record`: the charge the processor made, with its ledger transaction and its event,
    /// written as a charge's finish writes them.
    Charge(&'a Charge),
    /// `void`: what the processor gave back; and the pending record the voided charge was made
    /// for, if any, which ends with `response`.
    Void {
        tenant: Option<&'a TenantId>,
        processor_id: &'a str,
        money: Money,
        held: Option<HeldEnd<'a>>,
    },
}

/// A pending record that no attempt will ever finish, and the final answer it ends with.
#[derive(Debug, Clone, Copy)]
pub struct HeldEnd<'a> {
    pub scope: &'a Scope,
    pub key: &'a IdempotencyKey,
    pub response: &'a StoredResponse,
}

/// Holds the open exception `$1` for the generation `$2`, if it is free or held by this
/// generation already (a retry, a takeover).
const HOLD_EXCEPTION: &str = "
UPDATE reconciliation_exceptions SET held_by = $2
WHERE id = $1 AND status = 'open' AND (held_by IS NULL OR held_by = $2)";

const RESOLVE_EXCEPTION: &str = "
UPDATE reconciliation_exceptions SET status = 'resolved', held_by = NULL
WHERE id = $1 AND status = 'open' AND held_by = $2";

const RELEASE_EXCEPTION: &str = "
UPDATE reconciliation_exceptions SET held_by = NULL WHERE held_by = $1 AND status = 'open'";

const INSERT_RESOLUTION: &str = "
INSERT INTO reconciliation_resolutions
    (exception_id, action, operator, note, recorded_id, void_tenant_id, void_processor_id,
     void_amount, void_currency, resolved_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

#[async_trait]
impl ResolutionRepository for DatabaseStore {
    async fn hold_exception(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        id: ExceptionId,
    ) -> Result<ExceptionHold, StoreError> {
        let mut connection = transaction.connection();
        let held = Sql::new(HOLD_EXCEPTION)
            .bind(id.as_uuid())
            .bind(owner.fence.generation)
            .execute(&mut connection)
            .await?
            == 1;
        let row: Option<ExceptionRow> = Sql::new(EXCEPTION)
            .bind(id.as_uuid())
            .fetch_optional(&mut connection)
            .await?;
        let Some(exception) = row.map(ExceptionRow::into_exception).transpose()? else {
            return Ok(ExceptionHold::Missing);
        };
        Ok(match (held, exception.status) {
            (true, _) => ExceptionHold::Held(Box::new(exception)),
            (false, ExceptionStatus::Resolved) => ExceptionHold::Resolved,
            (false, ExceptionStatus::Open) => ExceptionHold::HeldByAnother,
        })
    }

    async fn finish_resolution(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        resolution: &NewResolution<'_>,
    ) -> Result<(), StoreError> {
        let mut connection = transaction.connection();
        let resolved = Sql::new(RESOLVE_EXCEPTION)
            .bind(resolution.exception.as_uuid())
            .bind(owner.fence.generation)
            .execute(&mut connection)
            .await?;
        if resolved != 1 {
            return Err(StoreError::Corrupt(format!(
                "exception {} is not held by the resolution finishing it",
                resolution.exception
            )));
        }
        insert_resolution(&mut connection, resolution).await?;
        match resolution.posts {
            Posting::Nothing => {}
            Posting::Charge(charge) => self.insert_charge(transaction, charge).await?,
            Posting::Void { held, .. } => {
                if let Some(held) = held {
                    // None when the record has ended meanwhile (reaped, or finished): nothing
                    // is left to end.
                    self.record_store()
                        .complete_held(transaction, held.scope, held.key, held.response)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Lets the exception go, still open, for a resolution under another key.
    async fn release_exception(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
    ) -> Result<(), StoreError> {
        Sql::new(RELEASE_EXCEPTION)
            .bind(owner.fence.generation)
            .execute(&mut transaction.connection())
            .await?;
        Ok(())
    }
}

/// Inserts the resolution's row: who, when, why, and what it posted or gave back.
async fn insert_resolution(
    connection: &mut Connection<'_>,
    resolution: &NewResolution<'_>,
) -> Result<(), StoreError> {
    let (recorded, void) = match resolution.posts {
        Posting::Nothing => (None, None),
        Posting::Charge(charge) => (Some(charge.id.to_string()), None),
        Posting::Void {
            tenant,
            processor_id,
            money,
            ..
        } => (None, Some((tenant, processor_id, money))),
    };
    Sql::new(INSERT_RESOLUTION)
        .bind(resolution.exception.as_uuid())
        .bind(resolution.action.as_str())
        .bind(resolution.operator)
        .bind(resolution.note.as_str())
        .bind(recorded.as_deref())
        .bind(void.and_then(|(tenant, ..)| tenant.map(|t| t.as_str())))
        .bind(void.map(|(_, processor_id, _)| processor_id))
        .bind(void.map(|(.., money)| money.amount.minor_units()))
        .bind(void.map(|(.., money)| money.currency.code()))
        .bind(resolution.resolved_at)
        .execute(connection)
        .await?;
    Ok(())
}
