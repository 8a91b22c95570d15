//! Finishes in batches: on a store that writes batches ([`RecordBatches::begin_batch`]), the
//! finishes of an operation's concurrent requests share one transaction and one commit. The
//! operation writes the rows of every finish of the batch first ([`FinishesInBatches::write_rows`]);
//! then the records are completed, in one call for the batch ([`RecordBatches::complete_many`]),
//! each fenced on its own; then the batch commits. The records are held only from their
//! completion to the commit, as a lone finish holds its record: a claim of one of their keys
//! elsewhere never waits out the rows' writing. A record another attempt owns now fails the
//! batch, which has written rows for it: the batch is dropped, and each of its finishes is
//! written alone, fenced as always.
//!
//! A finish joins its operation's queue. If no request is writing the queue, this one writes
//! it, a batch of up to [`MAX_FINISHES`] at a time, until its own finish is written, and then
//! hands the queue to the next request still waiting in it. Nobody waits for others to
//! arrive: a lone finish is written at once, on its own, the way it would be without a
//! queue. The finishes that arrive while a batch is on its way are the next batch's.
//!
//! Every finish of every tenant of the operation waits behind the queue's writer, so the
//! queue's transactions wait only briefly for a row another transaction holds (the store's
//! [`begin_batch`](RecordBatches::begin_batch)): a row held by another request of a tenant, or
//! by an instance frozen mid-transaction, fails the batch as busy. So does any other failure:
//! a batch that fails wrote nothing (or, if its commit went unanswered, perhaps everything),
//! and each of its requests then finishes once more alone, in its own transaction, fenced as
//! always, off the queue: one held or bad row delays or fails only its own request, and a
//! committed batch is found completed. A request whose writer went away mid-batch (its request
//! was dropped) finishes alone the same way. A finish whose own request went away stays queued
//! and is written with the next batch; if no other finish comes, its record stays pending with
//! its effect made, and the completer finishes it, as it would a lone finish's request dropped
//! before it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::operation::FinishesInBatches;
use super::ports::{Completion, End, Fence, Owner};
use super::transaction::{Ended, Sharing, recorded};
use super::{Engine, Operation, ProtocolError, StoreFailure, error_chain};
use crate::{IdempotencyKey, Scope, StoredResponse};

/// The most finishes one batch writes.
const MAX_FINISHES: usize = 64;

/// How an operation's finishes are written together, without the engine naming the
/// operation's rows: the queue of an operation that [`FinishesInBatches`].
#[async_trait]
pub(super) trait Batches<O: Operation>: Send + Sync + fmt::Debug {
    /// Finishes the effect `effect_id` for the generation `owner` holds, in a batch with
    /// whatever other finishes of the operation are waiting.
    async fn finish(
        &self,
        engine: &Engine<O::Transaction>,
        op: &O,
        owner: Owner<'_>,
        plan: &O::Plan,
        effect_id: String,
    ) -> Result<Ended, ProtocolError>;
}

/// The finishes of one operation waiting to be written, and whether a request is writing them.
pub(super) struct FinishQueue<O: FinishesInBatches> {
    queue: Mutex<Queue<O>>,
}

struct Queue<O: FinishesInBatches> {
    waiting: VecDeque<Queued<O>>,
    /// Whether a request holds the turn to write the queue.
    writing: bool,
}

/// A finish, owned, and how its request hears what came of it.
struct Queued<O: FinishesInBatches> {
    scope: Scope,
    key: IdempotencyKey,
    fence: Fence,
    rows: O::Rows,
    response: StoredResponse,
    told: mpsc::UnboundedSender<Told>,
}

impl<O: FinishesInBatches> Queued<O> {
    fn owner(&self) -> Owner<'_> {
        Owner::new(&self.scope, &self.key, self.fence)
    }

    /// The record's key, as the store orders its rows.
    fn record(&self) -> (&str, &str, &str) {
        (&self.scope.tenant, &self.scope.operation, self.key.as_str())
    }

    /// What the finish came to, once its record's end is `completion` and committed.
    fn ended(&self, completion: Completion) -> Ended {
        match completion {
            Completion::Stored { expires_at } => {
                recorded::<O>(self.owner());
                Ended::Stored {
                    response: self.response.clone(),
                    expires_at,
                }
            }
            Completion::Fenced => Ended::Fenced,
        }
    }
}

/// What a waiting request hears.
enum Told {
    /// Its finish was written with its batch (or found fenced).
    Written(Result<Ended, ProtocolError>),
    /// Its batch failed: it finishes once more alone.
    Alone,
    /// It writes the queue now.
    YourTurn,
}

impl<O: FinishesInBatches> Default for FinishQueue<O> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                writing: false,
            }),
        }
    }
}

impl<O: FinishesInBatches> fmt::Debug for FinishQueue<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.lock();
        f.debug_struct("FinishQueue")
            .field("waiting", &queue.waiting.len())
            .field("writing", &queue.writing)
            .finish()
    }
}

impl<O: FinishesInBatches> FinishQueue<O> {
    fn lock(&self) -> MutexGuard<'_, Queue<O>> {
        // The queue is left consistent at every point a panic could unwind from.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next batch: the longest-waiting finishes, up to [`MAX_FINISHES`].
    fn take_batch(&self) -> Vec<Queued<O>> {
        let mut queue = self.lock();
        let n = queue.waiting.len().min(MAX_FINISHES);
        queue.waiting.drain(..n).collect()
    }
}

/// The turn to write the queue. Dropped (its request answered, or gone), it passes to the
/// longest-waiting request still listening, or ends if none is.
struct Turn<'a, O: FinishesInBatches>(&'a FinishQueue<O>);

impl<O: FinishesInBatches> Drop for Turn<'_, O> {
    fn drop(&mut self) {
        let mut queue = self.0.lock();
        // A finish whose request went away stays queued, for the next batch to write.
        let passed = queue
            .waiting
            .iter()
            .any(|queued| queued.told.send(Told::YourTurn).is_ok());
        if !passed {
            queue.writing = false;
        }
    }
}

/// A request waiting for its finish. Dropped with the turn on its way to it, it passes the
/// turn on.
struct Waiting<'a, O: FinishesInBatches> {
    queue: &'a FinishQueue<O>,
    hear: mpsc::UnboundedReceiver<Told>,
}

impl<O: FinishesInBatches> Drop for Waiting<'_, O> {
    fn drop(&mut self) {
        self.hear.close();
        while let Ok(told) = self.hear.try_recv() {
            if let Told::YourTurn = told {
                drop(Turn(self.queue));
            }
        }
    }
}

#[async_trait]
impl<O: FinishesInBatches> Batches<O> for FinishQueue<O>
where
    O::Transaction: 'static,
{
    async fn finish(
        &self,
        engine: &Engine<O::Transaction>,
        op: &O,
        owner: Owner<'_>,
        plan: &O::Plan,
        effect_id: String,
    ) -> Result<Ended, ProtocolError> {
        let (rows, response) = op.rows(owner, plan, effect_id.clone())?;
        let (told, hear) = mpsc::unbounded_channel();
        let mut waiting = Waiting { queue: self, hear };
        let writes = {
            let mut queue = self.lock();
            queue.waiting.push_back(Queued {
                scope: owner.scope.clone(),
                key: owner.key.clone(),
                fence: owner.fence,
                rows,
                response,
                told,
            });
            !std::mem::replace(&mut queue.writing, true)
        };
        let mut turn = writes.then(|| Turn(self));
        let told = loop {
            if turn.is_some() {
                let batch = self.take_batch();
                if batch.is_empty() {
                    // Never, while this request's finish is unanswered; but should it be
                    // answered nowhere, it finishes alone rather than wait.
                    break None;
                }
                engine.write_batch(op, batch).await;
                match waiting.hear.try_recv() {
                    Ok(told) => break Some(told),
                    Err(_) => continue,
                }
            }
            match waiting.hear.recv().await {
                Some(Told::YourTurn) => turn = Some(Turn(self)),
                told => break told,
            }
        };
        drop(turn);
        match told {
            Some(Told::Written(ended)) => ended,
            // The batch failed, or its writer went away with it: alone, fenced as always, so
            // that a batch that did commit is found completed.
            Some(Told::Alone | Told::YourTurn) | None => {
                engine
                    .finish_once(op, owner, plan, effect_id, Sharing::Alone)
                    .await
            }
        }
    }
}

impl<T: Send + 'static> Engine<T> {
    /// Writes `batch` and tells each of its requests what came of its finish.
    async fn write_batch<O: FinishesInBatches<Transaction = T>>(
        &self,
        op: &O,
        mut batch: Vec<Queued<O>>,
    ) {
        self.observer.finishes_written(O::FAMILY, batch.len());
        if let [lone] = batch.as_slice() {
            let told = match self.write_lone(op, lone).await {
                // A row held past the queue's short wait: alone, off the queue, it may wait
                // as long as any statement does.
                Err(ProtocolError::Store(failure)) if failure.is_busy() => Told::Alone,
                ended => Told::Written(ended),
            };
            let _ = lone.told.send(told);
            return;
        }
        // In key order, so that two batches that meet on records lock them in one order.
        batch.sort_by(|a, b| a.record().cmp(&b.record()));
        match self.write_together(op, &batch).await {
            Ok(ended) => {
                for (queued, ended) in batch.iter().zip(ended) {
                    let _ = queued.told.send(Told::Written(Ok(ended)));
                }
            }
            Err(error) => {
                tracing::warn!(
                    idempotency.operation = O::FAMILY,
                    batch = batch.len(),
                    error = %error_chain(&error),
                    "a batch of finishes failed; each finishes alone"
                );
                for queued in &batch {
                    let _ = queued.told.send(Told::Alone);
                }
            }
        }
    }

    /// A finish with no other waiting: written in a transaction of its own, as it would be
    /// without a queue, but one that waits for a held row only as briefly as a batch does.
    async fn write_lone<O: FinishesInBatches<Transaction = T>>(
        &self,
        op: &O,
        queued: &Queued<O>,
    ) -> Result<Ended, ProtocolError> {
        let owner = queued.owner();
        let mut transaction = self.batch_store()?.begin_batch().await?;
        op.write_rows(&mut transaction, &[&queued.rows]).await?;
        let end = End::Made(&queued.response);
        let completion = self.end_in(transaction, owner, end).await?;
        Ok(queued.ended(completion))
    }

    /// The rows of the batch's finishes written, then their records completed, and one commit.
    /// A record that another attempt or generation owns now fails the batch: its rows were
    /// written, so the transaction is dropped with them, and each finish is written alone.
    async fn write_together<O: FinishesInBatches<Transaction = T>>(
        &self,
        op: &O,
        batch: &[Queued<O>],
    ) -> Result<Vec<Ended>, ProtocolError> {
        let batches = self.batch_store()?;
        let mut transaction = batches.begin_batch().await?;
        let rows: Vec<&O::Rows> = batch.iter().map(|queued| &queued.rows).collect();
        op.write_rows(&mut transaction, &rows).await?;
        let records: Vec<_> = batch
            .iter()
            .map(|queued| (queued.owner(), &queued.response))
            .collect();
        let completions = batches.complete_many(&mut transaction, &records).await?;
        let fenced = completions
            .iter()
            .filter(|completion| matches!(completion, Completion::Fenced))
            .count();
        if fenced > 0 {
            return Err(ProtocolError::Store(StoreFailure::batch_failed(format!(
                "{fenced} of the batch's records are owned by another attempt now"
            ))));
        }
        self.records.commit(transaction).await?;
        Ok(batch
            .iter()
            .zip(completions)
            .map(|(queued, completion)| queued.ended(completion))
            .collect())
    }
}
