//! How this crate runs a statement on either backend: [`Sql`], a statement's whole text with its
//! values bound in the order of its numbered placeholders (`$1`, `$2`, …; SQLite reads `$N` as
//! the N-th value too), run on a [`Connection`] of either backend.
//!
//! A statement is the same text on both backends unless the dialects really differ (the clock,
//! the row lock, the order of the events feed): then it is an [`Each`], the two texts side by
//! side. No statement is assembled from fragments: each can be pasted into `psql` or
//! `sqlite3` as it stands.

use chrono::{DateTime, NaiveDate, Utc};
use payments_idempotency_sql::Connection;
use payments_idempotency_sql::postgres::answered;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, FromRow};
use uuid::Uuid;

/// A statement whose text differs between the backends, both texts side by side.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Each {
    pub(crate) postgres: &'static str,
    pub(crate) sqlite: &'static str,
}

/// A statement's text: one for both backends, or [`Each`]'s own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Text {
    Both(&'static str),
    Each(Each),
}

impl From<&'static str> for Text {
    fn from(text: &'static str) -> Self {
        Self::Both(text)
    }
}

impl From<Each> for Text {
    fn from(each: Each) -> Self {
        Self::Each(each)
    }
}

/// A value bound into a statement, as both backends take it. A time is the one value the
/// backends store differently: PostgreSQL as `timestamptz`, SQLite as text in the one form
/// its keyset comparisons order correctly (`stored_time`).
#[derive(Debug, Clone)]
pub(crate) enum Value<'a> {
    Text(Option<&'a str>),
    SmallInt(i16),
    Int(Option<i64>),
    Float(f64),
    Uuid(Option<Uuid>),
    Time(DateTime<Utc>),
    Date(NaiveDate),
    Bytes(&'a [u8]),
    Json(serde_json::Value),
}

/// `From` each type a statement binds into its variant: `Value::from(7_i64)` is `Int(Some(7))`.
macro_rules! bound_as {
    ($($type:ty => $variant:ident),* $(,)?) => {$(
        impl<'a> From<$type> for Value<'a> {
            fn from(value: $type) -> Self {
                Self::$variant(value.into())
            }
        }
    )*};
}

bound_as! {
    &'a str => Text,
    Option<&'a str> => Text,
    i16 => SmallInt,
    i64 => Int,
    Option<i64> => Int,
    f64 => Float,
    Uuid => Uuid,
    Option<Uuid> => Uuid,
    DateTime<Utc> => Time,
    NaiveDate => Date,
    &'a [u8] => Bytes,
    serde_json::Value => Json,
}

/// A row both backends read: every row type here derives `FromRow`, which makes it one.
pub(crate) trait Row: for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow> {}

impl<R> Row for R where R: for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow> {}

/// A statement and its values, run once on a connection of either backend.
#[derive(Debug)]
pub(crate) struct Sql<'a> {
    text: Text,
    values: Vec<Value<'a>>,
}

impl<'a> Sql<'a> {
    pub(crate) fn new(text: impl Into<Text>) -> Self {
        Self {
            text: text.into(),
            values: Vec::new(),
        }
    }

    /// Binds the next placeholder's value.
    pub(crate) fn bind(mut self, value: impl Into<Value<'a>>) -> Self {
        self.values.push(value.into());
        self
    }

    /// Runs the statement and returns how many rows it changed.
    pub(crate) async fn execute(self, connection: &mut Connection<'_>) -> Result<u64, sqlx::Error> {
        Ok(match connection {
            Connection::Postgres(connection) => {
                let connection = &mut **connection;
                let (text, arguments) = self.postgres()?;
                let query = sqlx::query_with(text, arguments);
                answered(query.execute(connection)).await?.rows_affected()
            }
            Connection::Sqlite(connection) => {
                let connection = &mut **connection;
                let (text, arguments) = self.sqlite()?;
                let query = sqlx::query_with(text, arguments);
                query.execute(connection).await?.rows_affected()
            }
        })
    }

    /// Runs the statement and reads the row it returned, if any.
    pub(crate) async fn fetch_optional<R: Row + Send + Unpin>(
        self,
        connection: &mut Connection<'_>,
    ) -> Result<Option<R>, sqlx::Error> {
        match connection {
            Connection::Postgres(connection) => {
                let connection = &mut **connection;
                let (text, arguments) = self.postgres()?;
                let query = sqlx::query_as_with(text, arguments);
                answered(query.fetch_optional(connection)).await
            }
            Connection::Sqlite(connection) => {
                let connection = &mut **connection;
                let (text, arguments) = self.sqlite()?;
                let query = sqlx::query_as_with(text, arguments);
                query.fetch_optional(connection).await
            }
        }
    }

    /// Runs the statement and reads the one row it must return.
    pub(crate) async fn fetch_one<R: Row + Send + Unpin>(
        self,
        connection: &mut Connection<'_>,
    ) -> Result<R, sqlx::Error> {
        self.fetch_optional(connection)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs the statement and reads every row it returned.
    pub(crate) async fn fetch_all<R: Row + Send + Unpin>(
        self,
        connection: &mut Connection<'_>,
    ) -> Result<Vec<R>, sqlx::Error> {
        match connection {
            Connection::Postgres(connection) => {
                let connection = &mut **connection;
                let (text, arguments) = self.postgres()?;
                let query = sqlx::query_as_with(text, arguments);
                answered(query.fetch_all(connection)).await
            }
            Connection::Sqlite(connection) => {
                let connection = &mut **connection;
                let (text, arguments) = self.sqlite()?;
                let query = sqlx::query_as_with(text, arguments);
                query.fetch_all(connection).await
            }
        }
    }

    fn postgres(self) -> Result<(&'static str, PgArguments), sqlx::Error> {
        let text = match self.text {
            Text::Both(text) => text,
            Text::Each(each) => each.postgres,
        };
        let mut arguments = PgArguments::default();
        for value in self.values {
            match value {
                Value::Text(v) => arguments.add(v),
                Value::SmallInt(v) => arguments.add(v),
                Value::Int(v) => arguments.add(v),
                Value::Float(v) => arguments.add(v),
                Value::Uuid(v) => arguments.add(v),
                Value::Time(v) => arguments.add(v),
                Value::Date(v) => arguments.add(v),
                Value::Bytes(v) => arguments.add(v),
                Value::Json(v) => arguments.add(v),
            }
            .map_err(sqlx::Error::Encode)?;
        }
        Ok((text, arguments))
    }

    fn sqlite(self) -> Result<(&'static str, SqliteArguments<'a>), sqlx::Error> {
        let text = match self.text {
            Text::Both(text) => text,
            Text::Each(each) => each.sqlite,
        };
        let mut arguments = SqliteArguments::default();
        for value in self.values {
            match value {
                Value::Text(v) => arguments.add(v),
                Value::SmallInt(v) => arguments.add(v),
                Value::Int(v) => arguments.add(v),
                Value::Float(v) => arguments.add(v),
                Value::Uuid(v) => arguments.add(v),
                Value::Time(v) => arguments.add(stored_time(v)),
                Value::Date(v) => arguments.add(v),
                Value::Bytes(v) => arguments.add(v),
                Value::Json(v) => arguments.add(v),
            }
            .map_err(sqlx::Error::Encode)?;
        }
        Ok((text, arguments))
    }
}

/// A time as SQLite's time columns hold it: six digits of fraction, so that the text orders as
/// the time does, and keyset comparisons of `(created_at, id)` hold.
fn stored_time(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}
