//! The storage layer's one error type.

use payments_idempotency::engine::{ProtocolError, StoreFailure};
use sqlx::error::DatabaseError;

/// Why a storage operation failed. The API maps `Unavailable` to 503 (fail closed: no record,
/// no execution) and everything else to 500.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or did not answer in time.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
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
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if is_unavailable(&error) {
            if is_read_only(&error) || crate::dialect::is_no_answer(&error) {
                crate::postgres::distrust_open_connections();
            }
            return Self::Unavailable(error);
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

/// What the engine sees of a storage failure: whether it was unavailability (503, retry
/// later) or anything else, with the error itself as the source.
impl From<StoreError> for StoreFailure {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(_) => Self::unavailable(error),
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

/// The result code of an SQLite error; `None` for any other database's error.
fn sqlite_code(db: &dyn DatabaseError) -> Option<i32> {
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    db.code()?.parse().ok()
}

/// Whether PostgreSQL refused a write because the node is (now) a standby.
fn is_read_only(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .filter(|db| sqlite_code(*db).is_none())
        .and_then(|db| db.code())
        .is_some_and(|code| code == READ_ONLY_SQL_TRANSACTION)
}

/// A write on a primary that has been demoted to a standby.
const READ_ONLY_SQL_TRANSACTION: &str = "25006";

const SQLITE_CONSTRAINT: i32 = 19;
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;

fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        // A protocol error means the connection itself is broken (a handshake cut short, a
        // peer that is not PostgreSQL): nothing ran, and retrying later can succeed.
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // 08xxx connection exceptions, 57P01 admin_shutdown, 57P03 cannot_connect_now, 57014
        // a statement cancelled by `statement_timeout` (rolled back: nothing it did holds),
        // and 25006 a write on a primary that was demoted (nothing written).
        sqlx::Error::Database(db) => match sqlite_code(db.as_ref()) {
            // SQLite: another writer kept the database locked past the busy timeout.
            Some(code) => matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED),
            None => db.code().is_some_and(|code| {
                code.starts_with("08")
                    || matches!(
                        &*code,
                        "57P01" | "57P03" | "57014" | READ_ONLY_SQL_TRANSACTION
                    )
            }),
        },
        _ => false,
    }
}
