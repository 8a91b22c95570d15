//! What the record store tells of its group commits, on either backend: on SQLite every write
//! of a process shares its commit with the writes queued beside it (`sqlite/batch.rs`), on
//! PostgreSQL concurrent claims share a statement (`postgres/claims.rs`).
//! Both keep their counts and their observer in a [`CommitLog`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// A commit about to be made: how many writes it holds, and how many of them are records'
/// transactions (an operation's rows and its record's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit {
    pub writes: usize,
    pub records: usize,
}

/// Sees every group commit just before it is made (its size, for metrics), and once it is
/// made, before any of its writers hears of it.
pub trait CommitObserver: Send + Sync + std::fmt::Debug {
    fn committing(&self, commit: GroupCommit);

    fn committed(&self, _commit: GroupCommit) {}
}

/// A store's group commits so far, and the writers waiting for one now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupCommits {
    /// Commits made: on SQLite a batch or a write alone, on PostgreSQL a statement of claims.
    pub commits: u64,
    /// Writes those commits held: `writes / commits` is the mean batch size.
    pub writes: u64,
    /// Commits that failed, each member then written again alone (on PostgreSQL, unless the
    /// database did not answer).
    pub failed: u64,
    /// Writers waiting now: on SQLite to begin, on PostgreSQL claims for a statement.
    pub waiting: usize,
    /// Writes left in the open batch now, waiting for its commit (SQLite's; none on
    /// PostgreSQL, whose statement of claims is its commit).
    pub left: usize,
}

/// A store's group commits as they are made: how many, the writes they held, the failures, the
/// writers waiting now, and the observer each commit is shown to.
#[derive(Debug, Default)]
pub(crate) struct CommitLog {
    commits: AtomicU64,
    writes: AtomicU64,
    failed: AtomicU64,
    /// Writers waiting now: on SQLite at the gate, on PostgreSQL claims for a statement.
    pub(crate) waiting: AtomicUsize,
    /// Writes left in SQLite's open batch now, waiting for its commit.
    pub(crate) left: AtomicUsize,
    observer: OnceLock<Arc<dyn CommitObserver>>,
}

impl CommitLog {
    /// Shows every later commit to `observer`; the first observer set stays.
    pub(crate) fn observe(&self, observer: Arc<dyn CommitObserver>) {
        let _ = self.observer.set(observer);
    }

    /// Shows `commit` to the observer, just before it is made.
    pub(crate) fn committing(&self, commit: GroupCommit) {
        if let Some(observer) = self.observer.get() {
            observer.committing(commit);
        }
    }

    /// Counts `commit` made, and shows it to the observer before any of its writers hears of
    /// it.
    pub(crate) fn committed(&self, commit: GroupCommit) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        let writes = u64::try_from(commit.writes).unwrap_or(u64::MAX);
        self.writes.fetch_add(writes, Ordering::Relaxed);
        if let Some(observer) = self.observer.get() {
            observer.committed(commit);
        }
    }

    /// Counts a commit that failed.
    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn group_commits(&self) -> GroupCommits {
        GroupCommits {
            commits: self.commits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            left: self.left.load(Ordering::Relaxed),
        }
    }
}
