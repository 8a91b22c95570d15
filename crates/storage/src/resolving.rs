//! `ResolutionRepository`: an operator's resolution of a reconciliation exception holds the
//! exception for its record's generation, as a refund holds its amount (`holding.rs`), and its
//! finish writes the resolution and what it posts, in the transaction the engine completes the
//! record in.

use async_trait::async_trait;
use payments_domain::ExceptionId;
use payments_idempotency_sql::Connection;

use crate::model::{ExceptionHold, ExceptionStatus, NewResolution, Owner, Posting};
use crate::reconciling::EXCEPTION;
use crate::repository::{ChargeRepository, ResolutionRepository};
use crate::rows::ExceptionRow;
use crate::sql::Sql;
use crate::store::DatabaseStore;
use crate::{StoreError, Transaction};

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
