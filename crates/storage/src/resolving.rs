//! `ResolutionRepository`, written once for both backends over any [`SqlStore`]: an
//! operator's resolution of a reconciliation exception holds the exception for its record's
//! generation, as a refund holds its amount (`holding.rs`), and its finish writes the
//! resolution and what it posts, in the transaction the engine completes the record in.

use async_trait::async_trait;
use payments_domain::ExceptionId;

use crate::StoreError;
use crate::Transaction;
use crate::dialect::{Dialect, Statement};
use crate::model::{ExceptionHold, ExceptionStatus, NewResolution, Owner, Posting};
use crate::reconciling::SELECT_EXCEPTIONS;
use crate::repository::ResolutionRepository;
use crate::rows::ExceptionRow;
use crate::sql_store::SqlStore;

#[async_trait]
impl<S: SqlStore> ResolutionRepository for S {
    async fn hold_exception(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        id: ExceptionId,
    ) -> Result<ExceptionHold, StoreError> {
        let write = S::write_in(transaction)?;
        let generation = owner.fence.generation;
        // Open and free, or held by this generation already (a retry, a takeover).
        let mut hold = Statement::<S::Db>::new("UPDATE reconciliation_exceptions SET held_by = ");
        hold.value(generation)
            .push(" WHERE id = ")
            .value(id.as_uuid())
            .push(" AND status = 'open' AND (held_by IS NULL OR held_by = ")
            .value(generation)
            .push(")");
        let held = hold.execute(&mut *write).await? == 1;
        let mut read = Statement::<S::Db>::new(SELECT_EXCEPTIONS);
        read.push(" WHERE id = ").value(id.as_uuid());
        let row: Option<ExceptionRow> = read.fetch_optional(write).await?;
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
        let write = S::write_in(transaction)?;
        let exception = resolution.exception.as_uuid();
        let mut resolved = Statement::<S::Db>::new(
            "UPDATE reconciliation_exceptions SET status = 'resolved', held_by = NULL WHERE id = ",
        );
        resolved
            .value(exception)
            .push(" AND status = 'open' AND held_by = ")
            .value(owner.fence.generation);
        if resolved.execute(&mut *write).await? != 1 {
            return Err(StoreError::Corrupt(format!(
                "exception {} is not held by the resolution finishing it",
                resolution.exception
            )));
        }
        insert_resolution::<S::Db>(&mut *write, resolution).await?;
        match resolution.posts {
            Posting::Nothing => {}
            Posting::Charge(charge) => S::insert_charge(write, charge).await?,
            Posting::Void { held, .. } => {
                if let Some(held) = held {
                    // None when the record has ended meanwhile (reaped, or finished): nothing
                    // is left to end.
                    self.records()
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
        let mut release = Statement::<S::Db>::new(
            "UPDATE reconciliation_exceptions SET held_by = NULL WHERE held_by = ",
        );
        release
            .value(owner.fence.generation)
            .push(" AND status = 'open'");
        release.execute(S::write_in(transaction)?).await?;
        Ok(())
    }
}

/// Inserts the resolution's row: who, when, why, and what it posted or gave back.
async fn insert_resolution<DB: Dialect>(
    connection: &mut DB::Connection,
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
    let mut sql = Statement::<DB>::new(
        "INSERT INTO reconciliation_resolutions
             (exception_id, action, operator, note, recorded_id, void_tenant_id,
              void_processor_id, void_amount, void_currency, resolved_at)
         VALUES (",
    );
    sql.value(resolution.exception.as_uuid())
        .push(", ")
        .values([
            resolution.action.as_str(),
            resolution.operator,
            resolution.note.as_str(),
        ])
        .push(", ")
        .values([
            recorded.as_deref(),
            void.and_then(|(tenant, ..)| tenant.map(|t| t.as_str())),
            void.map(|(_, processor_id, _)| processor_id),
        ])
        .push(", ")
        .value(void.map(|(.., money)| money.amount.minor_units()))
        .push(", ")
        .value(void.map(|(.., money)| money.currency.code()))
        .push(", ");
    DB::push_time(&mut sql, resolution.resolved_at);
    sql.push(")");
    sql.execute(connection).await?;
    Ok(())
}
