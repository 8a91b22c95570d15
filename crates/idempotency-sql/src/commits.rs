//! What the record store tells of its group commits, on either backend: on SQLite every write
//! of a process shares its commit with the writes queued beside it (`sqlite/batch.rs`), on
//! PostgreSQL the inserts of concurrent fresh claims share a statement (`postgres/claims.rs`).

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
    /// Writers waiting now: on SQLite to begin, on PostgreSQL fresh claims for a statement.
    pub waiting: usize,
    /// Writes left in the open batch now, waiting for its commit (SQLite's; none on
    /// PostgreSQL, whose statement of claims is its commit).
    pub left: usize,
}
