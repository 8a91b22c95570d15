//! The record's transaction, which the engine owns: it begins one over the record, the
//! operation writes its own rows in it, and the engine ends the record in it and commits. So
//! an operation's rows exist exactly when its record says they do, fenced once, here, for
//! every operation: where the transaction begins, or, for a store that fences the
//! transactions that end records at their end ([`Begin::ENDING`]), where the
//! record ends, and then the operation's rows are dropped with the transaction.
//!
//! A store may commit several records' transactions together (a group commit). When such a
//! commit fails, nothing of any of them was written, and each is done once more alone
//! ([`Begin::alone`]): one bad row fails its own request, not its batch.

use chrono::{DateTime, Utc};

use super::ports::{Begin, Completion, End, Owner, RecordStore, Unmade};
use super::{Engine, Operation, Prepared, Preparing, ProtocolError, StoreFailure, error_chain};
use crate::StoredResponse;

/// Whether a record's transaction may share its commit with other records' transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sharing {
    /// The store's choice: a group commit, if it has one.
    Shared,
    /// Committed on its own: the second try after a shared commit failed.
    Alone,
}

impl Sharing {
    /// Begins the transaction over `owner`'s record in `records`, for `begin`, shared or
    /// alone.
    pub(super) async fn begin<T: Send + 'static>(
        self,
        records: &dyn RecordStore<Transaction = T>,
        owner: Owner<'_>,
        begin: Begin,
    ) -> Result<Option<T>, StoreFailure> {
        let begin = match self {
            Self::Shared => begin,
            Self::Alone => begin.alone(),
        };
        records.begin(owner, begin).await
    }
}

/// Runs `attempt` shared and, if the shared commit failed (having written nothing), once more
/// alone.
async fn shared_then_alone<V, F>(attempt: impl Fn(Sharing) -> F) -> Result<V, ProtocolError>
where
    F: Future<Output = Result<V, ProtocolError>>,
{
    match attempt(Sharing::Shared).await {
        Err(ProtocolError::Store(failure)) if failure.is_batch_failed() => {
            attempt(Sharing::Alone).await
        }
        done => done,
    }
}

/// Logs a finish's record completed, its operation's rows with it.
pub(super) fn recorded<O: Operation>(owner: Owner<'_>) {
    tracing::info!(
        idempotency.operation = O::FAMILY,
        idempotency.generation = %owner.fence.generation,
        "effect recorded"
    );
}

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
        shared_then_alone(|sharing| self.prepare_once(op, owner, request, sharing)).await
    }

    async fn prepare_once<O: Operation<Transaction = T>>(
        &self,
        op: &O,
        owner: Owner<'_>,
        request: &O::Request,
        sharing: Sharing,
    ) -> Result<Prepared<O::Plan>, ProtocolError> {
        let mut preparing = Preparing::new(self.records.as_ref(), owner, sharing);
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
        shared_then_alone(|sharing| self.finish_once(op, owner, plan, effect_id.clone(), sharing))
            .await
    }

    pub(super) async fn finish_once<O: Operation<Transaction = T>>(
        &self,
        op: &O,
        owner: Owner<'_>,
        plan: &O::Plan,
        effect_id: String,
        sharing: Sharing,
    ) -> Result<Ended, ProtocolError> {
        let Some(mut transaction) = sharing
            .begin(self.records.as_ref(), owner, Begin::ENDING)
            .await?
        else {
            return Ok(Ended::Fenced);
        };
        let response = op.finish(&mut transaction, owner, plan, effect_id).await?;
        let end = End::Made(&response);
        let Completion::Stored { expires_at } = self.end_in(transaction, owner, end).await? else {
            return Ok(Ended::Fenced);
        };
        recorded::<O>(owner);
        Ok(Ended::Stored {
            response,
            expires_at,
        })
    }

    /// What came of a finish, unless the store refused its rows for good after the effect
    /// `effect_id` was made ([`StoreFailure::refused`]): then no retry can ever finish it, so
    /// the record is completed with the operation's [`unrecorded`](Operation::unrecorded)
    /// answer instead, keeping the effect id for an operator, and every retry gets that answer
    /// rather than failing the same way again.
    pub(super) async fn unless_refused<O: Operation<Transaction = T>>(
        &self,
        op: &O,
        owner: Owner<'_>,
        effect_id: &str,
        finished: Result<Ended, ProtocolError>,
    ) -> Result<Ended, ProtocolError> {
        let refusal = match finished {
            Err(ProtocolError::Store(failure)) if failure.is_refused() => failure,
            finished => return finished,
        };
        let response = op.unrecorded(effect_id);
        let end = End::Unrecorded {
            effect_id,
            response: &response,
        };
        let records = self.records.as_ref();
        let begun = Sharing::Alone.begin(records, owner, Begin::ENDING).await?;
        let Some(transaction) = begun else {
            return Ok(Ended::Fenced);
        };
        // Fenced, the refusal was the rows of the attempt that owns the record now, which
        // answers: nothing is kept, and nothing is for an operator.
        let Completion::Stored { expires_at } = self.end_in(transaction, owner, end).await? else {
            return Ok(Ended::Fenced);
        };
        tracing::error!(
            idempotency.operation = O::FAMILY,
            idempotency.key = %owner.key,
            effect.id = effect_id,
            error = %error_chain(&refusal),
            "the effect was made but the store refused its rows for good; the record is kept \
             for an operator"
        );
        self.observer.effect_unrecorded(O::FAMILY);
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
        shared_then_alone(|sharing| self.end_unmade_once(op, owner, end, sharing)).await
    }

    async fn end_unmade_once<O: Operation<Transaction = T>>(
        &self,
        op: &O,
        owner: Owner<'_>,
        end: Unmade<'_>,
        sharing: Sharing,
    ) -> Result<Completion, ProtocolError> {
        let Some(mut transaction) = sharing
            .begin(self.records.as_ref(), owner, Begin::ENDING)
            .await?
        else {
            return Ok(Completion::Fenced);
        };
        op.end_unmade(&mut transaction, owner, end).await?;
        self.end_in(transaction, owner, End::Unmade(end)).await
    }

    /// Ends the record in `transaction` as `end` says and commits it; a record that may not end
    /// that way drops it, and with it everything the operation wrote.
    pub(super) async fn end_in(
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
