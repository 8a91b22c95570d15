//! Group commit: the write transactions of concurrent callers in this process share one SQLite
//! transaction and one commit.
//!
//! SQLite has one writer, and with `synchronous = FULL` each commit waits for the disk; a commit
//! per request makes the disk's flush the limit of every write path. So the write gate holds more
//! than a turn: the last writer through it leaves its transaction open ([`Batch`]) for the next,
//! each writer that joins others' work works inside a savepoint of its own (`member`, set in the
//! same round trip to the connection's thread as the writer's first statement:
//! [`WriteTx::opening`]), and the batch is committed once, by a task its first member starts, which
//! queues at the gate behind the writers waiting there and commits the batch once they have joined
//! it. Every member then hears the same outcome. A writer never waits for others to arrive: a lone
//! writer's batch is committed as soon as the gate is free, and the writers that queue while a
//! batch is being committed form the next one.
//!
//! A member that fails, or is dropped, rolls back to its savepoint and hands the batch on: its rows
//! are gone and the others' stay. A member done leaves its savepoint as it is, for the batch's
//! commit to release: the next member's savepoint nests inside it, and `ROLLBACK TO member` names
//! the innermost, its own. Releasing each would cost a round trip per member. A member whose
//! savepoint may or may not exist (its first statement failed, or it was dropped while that
//! statement ran) cannot be undone alone, since rolling back to `member` could then undo the member
//! before it: the batch is given up, as when a commit fails. A commit that fails fails every member
//! of the batch with [`Error::BatchFailed`], having written nothing; each then does its work again
//! alone ([`Sharing::Alone`]), so one bad row cannot fail many writers. Writes that are not a
//! request's (a migration, the completer's and the reaper's, a service's own) run alone.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use sqlx::sqlite::SqlitePool;
use sqlx::{Executor, Sqlite, SqliteConnection};
use tokio::sync::{Mutex, OwnedMutexGuard, oneshot};

use crate::commits::{CommitLog, CommitObserver, GroupCommit, GroupCommits};
use crate::error::Error;

/// The most writers one batch holds: a commit is never put off for long, and the outcomes
/// waiting on it stay few.
const MAX_MEMBERS: usize = 64;

/// Whether a write transaction may share its commit with other writers'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// In the open batch, under a savepoint of its own.
    Shared,
    /// A transaction of its own, committed on its own.
    Alone,
}

/// How a batch's commit went, as each of its members hears it.
type Outcome = Result<(), Arc<str>>;

/// An open write transaction that writers have left their work in, and the writers waiting
/// for its commit.
#[derive(Debug)]
struct Batch {
    /// Which batch of the gate's it is: its committer commits this one, no later one.
    id: u64,
    tx: sqlx::Transaction<'static, Sqlite>,
    members: Vec<Left>,
    /// How many of the members are records' transactions.
    records: usize,
}

/// The gate every writer of this process goes through, and the batch the last one left open.
#[derive(Debug, Clone)]
pub(crate) struct WriteGate {
    pool: SqlitePool,
    open: Arc<Mutex<Option<Batch>>>,
    log: Arc<CommitLog>,
    /// The id of the last batch begun.
    begun: Arc<AtomicU64>,
}

/// A member's work left in a batch: how it hears the batch's outcome, counted in
/// [`GroupCommits::left`] until it does (or the batch is dropped).
#[derive(Debug)]
struct Left {
    outcome: Option<oneshot::Sender<Outcome>>,
    log: Arc<CommitLog>,
}

impl Left {
    fn new(log: Arc<CommitLog>) -> (Self, oneshot::Receiver<Outcome>) {
        let (sender, receiver) = oneshot::channel();
        log.left.fetch_add(1, Ordering::Relaxed);
        let left = Self {
            outcome: Some(sender),
            log,
        };
        (left, receiver)
    }

    fn tell(mut self, outcome: Outcome) {
        if let Some(sender) = self.outcome.take() {
            let _ = sender.send(outcome);
        }
    }
}

impl Drop for Left {
    fn drop(&mut self) {
        self.log.left.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One writer counted as waiting at the gate, for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Self(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WriteGate {
    pub(crate) fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            open: Arc::new(Mutex::new(None)),
            log: Arc::default(),
            begun: Arc::default(),
        }
    }

    /// Shows every later commit to `observer`; the first observer set stays.
    pub(crate) fn observe(&self, observer: Arc<dyn CommitObserver>) {
        self.log.observe(observer);
    }

    pub(crate) fn group_commits(&self) -> GroupCommits {
        self.log.group_commits()
    }

    /// Waits for this process's other writers and commits the batch they left open, then
    /// holds the gate (migrations, which write outside a transaction of this store's).
    pub(crate) async fn lock(&self) -> WritesLocked {
        let mut gate = Arc::clone(&self.open).lock_owned().await;
        if let Some(batch) = gate.take() {
            self.commit(batch).await;
        }
        WritesLocked { _gate: gate }
    }

    /// Begins a write transaction that holds the write lock from its first statement on:
    /// `Shared`, in the open batch (or a new one) under its own savepoint; `Alone`, after
    /// the open batch is committed, in a transaction of its own.
    pub(crate) async fn begin(&self, sharing: Sharing) -> Result<WriteTx, Error> {
        let waiting = Waiting::new(&self.log.waiting);
        let mut gate = Arc::clone(&self.open).lock_owned().await;
        drop(waiting);
        let batch = match gate.take() {
            Some(batch) if sharing == Sharing::Shared && batch.members.len() < MAX_MEMBERS => batch,
            open => {
                if let Some(batch) = open {
                    self.commit(batch).await;
                }
                self.begin_batch().await?
            }
        };
        // A writer that joins others' work marks where its own begins, to undo only its own;
        // the first writer of a batch has nothing of others' to keep, and needs no mark.
        let mark = if sharing == Sharing::Shared && !batch.members.is_empty() {
            Mark::Owed
        } else {
            Mark::Unneeded
        };
        Ok(WriteTx {
            held: Some(Held { batch, gate }),
            sharing,
            mark,
            over_record: false,
            writers: self.clone(),
        })
    }

    /// The SQLite driver's custom BEGIN is not cancel-safe: a request dropped while it runs
    /// (its client went away, or it timed out) can leave the connection inside a transaction
    /// that nothing will roll back, holding the write lock for good. On a task of its own the
    /// BEGIN always finishes, and a transaction whose caller is gone is dropped there, which
    /// rolls it back. Once the caller holds it, dropping it is safe.
    async fn begin_batch(&self) -> Result<Batch, Error> {
        let pool = self.pool.clone();
        let tx = tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await })
            .await
            .map_err(|_| Error::from(sqlx::Error::WorkerCrashed))??;
        Ok(Batch {
            id: self.begun.fetch_add(1, Ordering::Relaxed),
            tx,
            members: Vec::new(),
            records: 0,
        })
    }

    /// Commits `batch` and tells each member how it went. On a task of its own, so that a
    /// caller dropped meanwhile leaves no member without an outcome.
    async fn commit(&self, batch: Batch) {
        let writers = self.clone();
        let committed = tokio::spawn(async move {
            let commit = GroupCommit {
                writes: batch.members.len(),
                records: batch.records,
            };
            writers.log.committing(commit);
            let outcome: Outcome = batch
                .tx
                .commit()
                .await
                .map_err(|error| Arc::from(error.to_string()));
            match outcome {
                Ok(()) => writers.log.committed(commit),
                Err(_) => writers.log.failed(),
            }
            for member in batch.members {
                member.tell(outcome.clone());
            }
        });
        // A task that panicked dropped its members' senders: they hear it was abandoned.
        let _ = committed.await;
    }

    /// Commits batch `id` once the writers queued at the gate now have joined it, unless it
    /// was committed meanwhile (when it filled up, or before a write alone). Spawned when the
    /// batch's first member leaves its work in it: the batch is committed even if every
    /// member is dropped while it waits.
    fn commit_when_joined(&self, id: u64) {
        let writers = self.clone();
        tokio::spawn(async move {
            let mut gate = Arc::clone(&writers.open).lock_owned().await;
            if gate.as_ref().is_some_and(|open| open.id == id)
                && let Some(batch) = gate.take()
            {
                writers.commit(batch).await;
            }
        });
    }
}

/// The outcome of a batch dropped uncommitted (a member's savepoint could not be undone):
/// rolled back, nothing written.
fn abandoned() -> Outcome {
    Err(Arc::from("the batch was rolled back"))
}

/// The gate held, with no batch open: nothing else of this process writes meanwhile.
#[derive(Debug)]
pub struct WritesLocked {
    _gate: OwnedMutexGuard<Option<Batch>>,
}

/// What a writer holds while it writes: the batch, and the gate.
#[derive(Debug)]
struct Held {
    batch: Batch,
    gate: OwnedMutexGuard<Option<Batch>>,
}

/// Where a writer stands with the savepoint that marks where its own work begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// None is needed: the writer is alone, or the first of its batch (nothing of others' to
    /// keep: undoing its work is rolling the transaction back).
    Unneeded,
    /// Not set yet, and nothing written: set by the writer's first statement.
    Owed,
    /// Set, or not, by a statement that failed or whose caller went away: which is not
    /// known, so the writer's work cannot be undone alone.
    Unknown,
    /// Set: `ROLLBACK TO member` undoes this writer's work and nothing else.
    Set,
}

/// The savepoint a writer that joins others' work sets before its first statement, in the
/// same round trip.
const MARK: &str = "SAVEPOINT member;";

/// Undoes the work of the writer whose savepoint is the innermost, and removes the savepoint.
const UNDO: &str = "ROLLBACK TO member; RELEASE member";

/// A write transaction: the gate, then SQLite's write lock, in the open batch under a
/// savepoint or alone. Dropped uncommitted, what it wrote is rolled back (its savepoint, or
/// its transaction).
#[derive(Debug)]
pub struct WriteTx {
    held: Option<Held>,
    sharing: Sharing,
    mark: Mark,
    /// Whether it is a record's transaction (counted in [`GroupCommit::records`]).
    over_record: bool,
    writers: WriteGate,
}

impl std::ops::Deref for WriteTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &Self::Target {
        &self.held.as_ref().expect("held until it ends").batch.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // A statement run before the savepoint is set would be outside it: this writer's
        // work could then no longer be undone alone.
        if self.mark == Mark::Owed {
            self.mark = Mark::Unknown;
        }
        &mut self.held.as_mut().expect("held until it ends").batch.tx
    }
}

impl WriteTx {
    /// The text to run this writer's first statement, `statement`, as: after its savepoint
    /// when it joins others' work, in the same round trip to the connection's thread. Until
    /// [`WriteTx::opened`] says the statement ran, the writer's work cannot be undone alone.
    pub(crate) fn opening(&mut self, statement: &'static str) -> Cow<'static, str> {
        match self.mark {
            Mark::Owed => {
                self.mark = Mark::Unknown;
                Cow::Owned(format!("{MARK}{statement}"))
            }
            _ => Cow::Borrowed(statement),
        }
    }

    /// The first statement, run as [`WriteTx::opening`] gave it, succeeded: the savepoint
    /// before it is set.
    pub(crate) fn opened(&mut self) {
        if self.mark == Mark::Unknown {
            self.mark = Mark::Set;
        }
    }

    /// Counts this transaction as a record's.
    pub(crate) fn over_record(mut self) -> Self {
        self.over_record = true;
        self
    }

    /// Commits: alone, at once; batched, by leaving the work in the batch and waiting for the
    /// batch's commit. `Ok` means durable either way.
    pub async fn commit(mut self) -> Result<(), Error> {
        let Held {
            mut batch,
            mut gate,
        } = self.held.take().expect("held until it ends");
        if self.sharing == Sharing::Alone {
            let commit = GroupCommit {
                writes: 1,
                records: usize::from(self.over_record),
            };
            self.writers.log.committing(commit);
            batch
                .tx
                .commit()
                .await
                .inspect_err(|_| self.writers.log.failed())?;
            self.writers.log.committed(commit);
            return Ok(());
        }
        // The work is left in the batch, its savepoint with it, before anything is awaited:
        // a caller dropped from here on has handed the batch on.
        let (left, outcome) = Left::new(Arc::clone(&self.writers.log));
        batch.members.push(left);
        batch.records += usize::from(self.over_record);
        if batch.members.len() == 1 {
            self.writers.commit_when_joined(batch.id);
        }
        *gate = Some(batch);
        drop(gate);
        let heard = outcome.await.unwrap_or_else(|_| abandoned());
        heard.map_err(|reason| Error::BatchFailed(reason.to_string()))
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        let Some(Held {
            mut batch,
            mut gate,
        }) = self.held.take()
        else {
            return;
        };
        match self.mark {
            // The transaction holds nothing but this writer's work: dropped, it rolls back.
            Mark::Unneeded => {}
            // Nothing of this writer's is in the batch: it goes on as it was.
            Mark::Owed => *gate = Some(batch),
            // Rolling back to `member` could undo the writer before this one: the batch is
            // dropped and rolled back, and its members hear it was abandoned and do their work
            // again alone.
            Mark::Unknown => {}
            Mark::Set => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                // Undo this writer's work alone and hand the batch on, holding the gate
                // meanwhile; if that fails, the batch is given up as above.
                runtime.spawn(async move {
                    if batch.tx.execute(UNDO).await.is_ok() {
                        *gate = Some(batch);
                    }
                });
            }
        }
    }
}
