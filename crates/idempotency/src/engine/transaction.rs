//! The record's transaction, which the engine owns: it begins one over the record, the
//! operation writes its own rows in it, and the engine ends the record in it and commits. So
//! an operation's rows exist exactly when its record says they do, fenced once, here, for
//! every operation.

use chrono::{DateTime, Utc};

use super::ports::{Completion, End, Owner, Unmade};
use super::{Engine, Operation, Prepared, Preparing, ProtocolError};
use crate::StoredResponse;

/// What a transaction that ends a record came to.
#[derive(Debug)]
pub(super) enum Ended {
    /// Committed: the record holds `response` until `expires_at`.
    Stored {
        response: StoredResponse,
        expires_at: DateTime<Utc>,
    },
    /// Another attempt or generation owns the record: nothing was written.
    Fenced,
}

impl<T: Send + 'static> Engine<T> {
    /// Prepares `request` for the generation `owner` holds ([`Operation::prepare`]) and commits
    /// what the preparation held, if it began a transaction. A refusal holds nothing: its
    /// transaction is dropped, and the record ends in a transaction of its own.
    pub(super) async fn prepare<O: Operation<Transaction = T>>(
        &self,
        op: &O,
        owner: Owner<'_>,
        request: &O::Request,
    ) -> Result<Prepared<O::Plan>, ProtocolError> {
        let mut preparing = Preparing::new(self.records.as_ref(), owner);
        let prepared = op.prepare(&mut preparing, owner, request).await?;
        if let (Prepared::Ready(_), Some(transaction)) = (&prepared, preparing.into_transaction()) {
            self.records.commit(transaction).await?;
        }
        Ok(prepared)
    }

    /// Step 4's write: in one transaction over the record, the operation's rows of the effect
    /// `effect_id` and the record completed with the operation's response.
    pub(super) async fn finish<O: Operation<Transaction = T>>(
        &self,
        op: &O,
        owner: Owner<'_>,
        plan: &O::Plan,
        effect_id: String,
    ) -> Result<Ended, ProtocolError> {
        let Some(mut transaction) = self.records.begin(owner).await? else {
            return Ok(Ended::Fenced);
        };
        let response = op.finish(&mut transaction, owner, plan, effect_id).await?;
        let end = End::Made(&response);
        let Completion::Stored { expires_at } = self.end_in(transaction, owner, end).await? else {
            return Ok(Ended::Fenced);
        };
        tracing::info!(
            idempotency.operation = O::FAMILY,
            idempotency.generation = %owner.fence.generation,
            "effect recorded"
        );
        Ok(Ended::Stored {
            response,
            expires_at,
        })
    }

    /// Ends the record without an effect (`end` says how), in one transaction over the record
    /// with what the operation undoes of its preparation ([`Operation::end_unmade`]).
    pub(super) async fn end_unmade<O: Operation<Transaction = T>>(
        &self,
        op: &O,
        owner: Owner<'_>,
        end: Unmade<'_>,
    ) -> Result<Completion, ProtocolError> {
        let Some(mut transaction) = self.records.begin(owner).await? else {
            return Ok(Completion::Fenced);
        };
        op.end_unmade(&mut transaction, owner, end).await?;
        self.end_in(transaction, owner, End::Unmade(end)).await
    }

    /// Ends the record in `transaction` as `end` says and commits it; a record that may not end
    /// that way drops it, and with it everything the operation wrote.
    async fn end_in(
        &self,
        mut transaction: T,
        owner: Owner<'_>,
        end: End<'_>,
    ) -> Result<Completion, ProtocolError> {
        let completion = self.records.end(&mut transaction, owner, end).await?;
        if completion != Completion::Fenced {
            self.records.commit(transaction).await?;
        }
        Ok(completion)
    }
}
