//! The storage layer's one error type.

use payments_idempotency::engine::{ProtocolError, StoreFailure};
use payments_idempotency_sql::{distrusts_connections, is_busy, is_unavailable, sqlite_code};

/// Why a storage operation failed. The API maps `Unavailable` to 503 (fail closed: no record,
/// no execution) and everything else to 500.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or did not answer in time.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A row (or table) the statement needed stayed held by another transaction for longer
    /// than the connection's `lock_timeout`: cancelled, having written nothing.
    #[error("a row the statement needed is held by another transaction")]
    Busy(#[source] sqlx::Error),
    /// A named constraint refused the write.
    #[error("constraint {constraint} was violated")]
    Constraint {
        constraint: String,
        #[source]
        source: sqlx::Error,
    },
    /// Any other database error.
    #[error("database error")]
    Database(#[source] sqlx::Error),
    /// A stored value could not be read back into its type.
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    #[error("migration failed: {0}")]
    Migration(String),
    /// The database cannot be used where it was configured (a directory that cannot be
    /// created, say).
    #[error("{0}")]
    Unusable(String),
    /// The commit this write shared with other requests' failed, having written nothing of it
    /// (the record store's group commit on SQLite).
    #[error("a group commit failed: {0}")]
    BatchFailed(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if is_unavailable(&error) {
            if distrusts_connections(&error) {
                payments_idempotency_sql::postgres::distrust_open_connections();
            }
            return Self::Unavailable(error);
        }
        if is_busy(&error) {
            return Self::Busy(error);
        }
        match violated_constraint(&error) {
            Some(constraint) => Self::Constraint {
                constraint,
                source: error,
            },
            None => Self::Database(error),
        }
    }
}

/// The record store's errors, as this crate's.
impl From<payments_idempotency_sql::Error> for StoreError {
    fn from(error: payments_idempotency_sql::Error) -> Self {
        use payments_idempotency_sql::Error;
        match error {
            Error::Unavailable(error) => Self::Unavailable(error),
            Error::Busy(error) => Self::Busy(error),
            // Payments' own judgement of a refusal: by the constraint's name.
            Error::Database(error) | Error::Refused(error) => Self::from(error),
            Error::Corrupt(what) => Self::Corrupt(what),
            Error::Unusable(what) => Self::Unusable(what),
            Error::BatchFailed(why) => Self::BatchFailed(why),
        }
    }
}

/// What the engine sees of a storage failure: whether it was unavailability (503, retry
/// later) or anything else, with the error itself as the source.
impl From<StoreError> for StoreFailure {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(_) => Self::unavailable(error),
            StoreError::Busy(_) => Self::busy(error),
            StoreError::BatchFailed(_) => Self::batch_failed(error),
            other => Self::other(other),
        }
    }
}

/// An operation's own writes fail the attempt as the engine's do.
impl From<StoreError> for ProtocolError {
    fn from(error: StoreError) -> Self {
        Self::Store(error.into())
    }
}

/// The name of the constraint a database error reports, if any: callers match on names (as
/// written in the migrations). PostgreSQL reports the name itself; SQLite only in its message
/// (`CHECK constraint failed: <name>`, or the trigger's `RAISE` text, which is the name).
pub(crate) fn violated_constraint(error: &sqlx::Error) -> Option<String> {
    let db = error.as_database_error()?;
    if let Some(name) = db.constraint() {
        return Some(name.to_owned());
    }
    // Extended result codes keep the primary code in the low byte.
    if sqlite_code(db)? & 0xff != SQLITE_CONSTRAINT {
        return None;
    }
    let message = db.message();
    let name = message
        .strip_prefix("CHECK constraint failed: ")
        .unwrap_or(message);
    Some(name.to_owned())
}

const SQLITE_CONSTRAINT: i32 = 19;
