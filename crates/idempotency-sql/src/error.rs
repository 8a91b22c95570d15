//! The record store's one error type, and how a database error is judged: unavailable (the
//! database could not be reached or did not answer: a retry later may succeed, and nothing was
//! written), busy (the database answered, but a row the statement needed stayed held by another
//! transaction for longer than the connection's `lock_timeout`: nothing was written either),
//! refused (a constraint, a value the column cannot hold: refused again on every retry) or
//! anything else.

use payments_idempotency::engine::StoreFailure;
use sqlx::error::DatabaseError;

/// Why a record-store call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be reached or did not answer in time.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A row (or table) the statement needed stayed held by another transaction for longer than
    /// the connection's `lock_timeout`: the statement was cancelled, having written nothing.
    /// Not unavailability: the database answered, and every other row is free.
    #[error("a row the statement needed is held by another transaction")]
    Busy(#[source] sqlx::Error),
    /// The database refused the write for a reason no retry changes: a row that breaks a
    /// constraint, a value its column cannot hold (a NUL in PostgreSQL's `text`, a number out
    /// of range). The same statement is refused every time ([`is_refused`]).
    #[error("the database refused the write")]
    Refused(#[source] sqlx::Error),
    /// Any other database error.
    #[error("database error")]
    Database(#[source] sqlx::Error),
    /// A stored value could not be read back into its type.
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// The database cannot be used where it was configured (a directory that cannot be
    /// created, say).
    #[error("{0}")]
    Unusable(String),
    /// The commit this write shared with other writers' failed: nothing of it was written, and
    /// it may be done again alone.
    #[error("a group commit failed: {0}")]
    BatchFailed(String),
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        if is_unavailable(&error) {
            if distrusts_connections(&error) {
                crate::postgres::distrust_open_connections();
            }
            return Self::Unavailable(error);
        }
        if is_busy(&error) {
            return Self::Busy(error);
        }
        if is_refused(&error) {
            return Self::Refused(error);
        }
        Self::Database(error)
    }
}

/// What the engine sees: unavailability (503, retry later), a held row (503), a refusal no
/// retry changes, or anything else.
impl From<Error> for StoreFailure {
    fn from(error: Error) -> Self {
        match error {
            Error::Unavailable(_) => Self::unavailable(error),
            Error::Busy(_) => Self::busy(error),
            Error::BatchFailed(_) => Self::batch_failed(error),
            Error::Refused(_) => Self::refused(error),
            other => Self::other(other),
        }
    }
}

pub(crate) fn corrupt(column: &str, value: impl std::fmt::Debug) -> Error {
    Error::Corrupt(format!("{column} = {value:?}"))
}

/// The result code of an SQLite error; `None` for any other database's error.
pub fn sqlite_code(db: &dyn DatabaseError) -> Option<i32> {
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    db.code()?.parse().ok()
}

/// A write on a primary that has been demoted to a standby.
const READ_ONLY_SQL_TRANSACTION: &str = "25006";
/// A lock wait cancelled by `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;

const SQLITE_TOOBIG: i32 = 18;
const SQLITE_CONSTRAINT: i32 = 19;
const SQLITE_MISMATCH: i32 = 20;
const SQLITE_CONSTRAINT_FOREIGNKEY: i32 = SQLITE_CONSTRAINT | (3 << 8);
/// A row that refers to one that does not exist (yet): not a refusal for good.
const FOREIGN_KEY_VIOLATION: &str = "23503";

/// Whether the database refused the statement for a reason no retry changes: on PostgreSQL a
/// data exception (class 22: a value the column cannot hold, such as a NUL in `text`) or an
/// integrity constraint violation (class 23, a trigger's refusal raised as one too); on SQLite
/// a constraint (a trigger's `RAISE(ABORT, ...)` too), a value too big or of the wrong type.
/// A foreign key is the exception on both: the row it refers to may be written later, and a
/// retry then succeeds.
pub fn is_refused(error: &sqlx::Error) -> bool {
    let Some(db) = error.as_database_error() else {
        return false;
    };
    match sqlite_code(db) {
        Some(SQLITE_CONSTRAINT_FOREIGNKEY) => false,
        // Extended result codes keep the primary code in the low byte.
        Some(code) => matches!(
            code & 0xff,
            SQLITE_TOOBIG | SQLITE_CONSTRAINT | SQLITE_MISMATCH
        ),
        None => db.code().is_some_and(|code| {
            (code.starts_with("22") || code.starts_with("23")) && code != FOREIGN_KEY_VIOLATION
        }),
    }
}

/// Whether PostgreSQL refused a write because the node is (now) a standby.
fn is_read_only(error: &sqlx::Error) -> bool {
    postgres_code_is(error, READ_ONLY_SQL_TRANSACTION)
}

/// Whether PostgreSQL cancelled the statement at its `lock_timeout`: a row or table it
/// waited for stayed held by another transaction.
pub fn is_busy(error: &sqlx::Error) -> bool {
    postgres_code_is(error, LOCK_NOT_AVAILABLE)
}

fn postgres_code_is(error: &sqlx::Error, expected: &str) -> bool {
    error
        .as_database_error()
        .filter(|db| sqlite_code(*db).is_none())
        .and_then(|db| db.code())
        .is_some_and(|code| code == expected)
}

/// Whether `error` means the database could not be reached or did not answer: nothing ran, and
/// a retry later can succeed. [`Error::from`] also distrusts the open PostgreSQL connections
/// when it says a node was demoted or went silent.
pub fn is_unavailable(error: &sqlx::Error) -> bool {
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
        // 25P03 and 57P05 a session the server ended after it sat idle (in a transaction, or
        // at all: the process was frozen past the timeout; its transaction rolled back), and
        // 25006 a write on a primary that was demoted (nothing written).
        sqlx::Error::Database(db) => match sqlite_code(db.as_ref()) {
            // SQLite: another writer kept the database locked past the busy timeout.
            Some(code) => matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED),
            None => db.code().is_some_and(|code| {
                code.starts_with("08")
                    || matches!(
                        &*code,
                        "57P01" | "57P03" | "57014" | "25P03" | "57P05" | READ_ONLY_SQL_TRANSACTION
                    )
            }),
        },
        _ => false,
    }
}

/// Whether unavailable `error` should make every open PostgreSQL connection suspect: the node
/// was demoted, or did not answer at all.
pub fn distrusts_connections(error: &sqlx::Error) -> bool {
    is_read_only(error) || is_no_answer(error)
}

/// The error of a round trip the database did not answer within `bound`: an I/O timeout,
/// unavailable like a broken connection (503, nothing stored).
pub fn no_answer(bound: std::time::Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the database did not answer within {} ms",
            bound.as_millis()
        ),
    ))
}

/// Whether `error` is [`no_answer`]'s.
fn is_no_answer(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)
}
