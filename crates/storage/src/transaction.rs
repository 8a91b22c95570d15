//! The write transaction of either backend that the engine begins over an idempotency record
//! (`RecordStore::begin`): the operation writes its rows in it, and the engine ends the record
//! in it and commits. Dropped uncommitted, it is rolled back.

use std::fmt;

use sqlx::Postgres;

use crate::StoreError;
use crate::sqlite::WriteTx;

/// A write transaction begun over one idempotency record, which it holds until it ends.
pub struct Transaction(pub(crate) Begun);

/// The backend's own transaction.
pub(crate) enum Begun {
    Postgres(sqlx::Transaction<'static, Postgres>),
    /// SQLite's in-process write gate and its `BEGIN IMMEDIATE` transaction.
    Sqlite(WriteTx),
}

impl fmt::Debug for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match self.0 {
            Begun::Postgres(_) => "postgres",
            Begun::Sqlite(_) => "sqlite",
        };
        f.debug_tuple("Transaction").field(&backend).finish()
    }
}

impl From<sqlx::Transaction<'static, Postgres>> for Transaction {
    fn from(transaction: sqlx::Transaction<'static, Postgres>) -> Self {
        Self(Begun::Postgres(transaction))
    }
}

impl From<WriteTx> for Transaction {
    fn from(write: WriteTx) -> Self {
        Self(Begun::Sqlite(write))
    }
}

/// A transaction handed to a store of the other backend: never done by the service, which
/// opens one store.
pub(crate) fn of_another_backend() -> StoreError {
    StoreError::Corrupt("a transaction of another backend's store".to_owned())
}
