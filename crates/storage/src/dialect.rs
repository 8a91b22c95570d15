//! How this crate writes SQL once for both backends: [`Statement`], the one way a statement is
//! built and run, and [`Dialect`], what the shared statements need of their database (how it
//! tells the time, how it locks a row, what it binds and reads, how sqlx runs a statement on
//! it). Each backend implements `Dialect` in its own folder (`postgres/dialect.rs`,
//! `sqlite/dialect.rs`); the shared code knows its database only through it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::error::BoxDynError;
use sqlx::{Arguments, Database, Encode, Execute, Executor, FromRow, Type};
use uuid::Uuid;

use crate::rows::{
    BooksRow, ChargeRow, EventRow, ExceptionRow, PayoutRow, RefundRow, RefundableRow, ReservedRow,
};

/// A value a backend binds into a statement: every type the shared statements bind.
pub(crate) trait Bind<'a, T>: Database {
    fn bind(arguments: &mut Self::Arguments<'a>, value: T) -> Result<(), BoxDynError>;
}

impl<'a, T, DB> Bind<'a, T> for DB
where
    DB: Database,
    T: 'a + Encode<'a, DB> + Type<DB>,
{
    fn bind(arguments: &mut Self::Arguments<'a>, value: T) -> Result<(), BoxDynError> {
        arguments.add(value)
    }
}

/// A row type a backend reads: every row the shared statements read back.
pub(crate) trait Reads<R>: Database {
    fn read(row: &Self::Row) -> Result<R, sqlx::Error>;
}

impl<R, DB> Reads<R> for DB
where
    DB: Database,
    R: for<'r> FromRow<'r, DB::Row>,
{
    fn read(row: &Self::Row) -> Result<R, sqlx::Error> {
        R::from_row(row)
    }
}

/// What differs between the backends in the statements they share: the clock, the row lock,
/// the order a ledger transaction is sealed in, and the values and rows the statements bind
/// and read (its `Bind` and `Reads` supertraits say so once, instead of every statement
/// repeating the `Encode` and `FromRow` bounds of each of its values).
pub(crate) trait Dialect:
    Database
    + for<'a> Bind<'a, &'a str>
    + for<'a> Bind<'a, Option<&'a str>>
    + for<'a> Bind<'a, &'a [u8]>
    + for<'a> Bind<'a, i16>
    + for<'a> Bind<'a, i32>
    + for<'a> Bind<'a, i64>
    + for<'a> Bind<'a, f64>
    + for<'a> Bind<'a, String>
    + for<'a> Bind<'a, Uuid>
    + for<'a> Bind<'a, Option<Uuid>>
    + for<'a> Bind<'a, serde_json::Value>
    + Reads<ChargeRow>
    + Reads<RefundRow>
    + Reads<PayoutRow>
    + Reads<RefundableRow>
    + Reads<ReservedRow>
    + Reads<(i32,)>
    + Reads<(i64,)>
    + Reads<(DateTime<Utc>,)>
    + Reads<(i64, Option<f64>)>
    + Reads<(Uuid, i64)>
    + Reads<(String, String)>
    + Reads<(String, String, i64)>
    + Reads<(String, i64, i64)>
    + Reads<EventRow>
    + Reads<BooksRow>
    + Reads<ExceptionRow>
    + for<'a> Bind<'a, Option<i64>>
    + for<'a> Bind<'a, chrono::NaiveDate>
{
    /// The database's clock, as an expression of the type of the time columns.
    const NOW: &'static str;

    /// The longest a statement waits for the database's answer before it is given up as
    /// unavailable ([`no_answer`]); `None` waits as long as it takes.
    fn answer_bound() -> Option<Duration>;

    /// Appended to a `SELECT` of one row to read it under a row lock.
    const LOCK_ROW: &'static str;

    /// Appended to the `SELECT` of the rows a worker's statement takes over or deletes, so
    /// that the workers of several instances take disjoint rows.
    const SKIP_LOCKED: &'static str;

    /// The seconds from the oldest `created_at` of the rows selected to now, as a double
    /// (`NULL` for no rows).
    const OLDEST_AGE_SECS: &'static str;

    /// Whether a ledger transaction's row goes in after its entries, sealing them (SQLite's
    /// balance trigger), rather than before them (PostgreSQL's immediate foreign key, with the
    /// balance checked at commit).
    const SEALS_LEDGER_LAST: bool;

    /// The order of the events feed (`GET /events`): a total order in which the rows a reader
    /// can see are always a prefix of the rows it will ever see (each backend's migration
    /// `event_feed` says how).
    const EVENT_FEED_ORDER: &'static str;

    /// Appended to the feed's `WHERE`: keeps back the rows that could still be preceded by a
    /// row not yet committed (empty where commit order is feed order).
    const EVENT_FEED_SETTLED: &'static str;

    /// Pushes the database's clock plus `after`, binding what the expression needs.
    fn push_now_plus(sql: &mut Statement<'_, Self>, after: Duration);

    /// Pushes the database's clock minus `before`, binding what the expression needs.
    fn push_now_minus(sql: &mut Statement<'_, Self>, before: Duration);

    /// Binds a time the service wrote (a charge's creation), as its time columns hold it.
    fn push_time(sql: &mut Statement<'_, Self>, time: DateTime<Utc>);

    /// `sql` with `arguments` bound, as sqlx runs it. Generic code cannot say this itself:
    /// SQLite's arguments make a query only for exactly the lifetime of the text they run
    /// with, and only the backend's own types show that arguments borrowed for longer will do.
    fn query<'q, 'a: 'q>(
        sql: &'q str,
        arguments: Self::Arguments<'a>,
    ) -> impl Execute<'q, Self> + 'q;

    /// A connection of this backend, as sqlx runs statements on it.
    fn on<'c>(connection: &'c mut Self::Connection) -> impl Executor<'c, Database = Self>;

    /// How many rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

/// A statement and the values bound into it: the one way this crate writes SQL for both
/// backends. Each fragment binds its values where it names them, so no statement depends on
/// parameter numbers kept in step elsewhere, and the text is the same on every call, so each
/// statement is prepared once per connection and then comes from sqlx's cache.
///
/// A statement runs once: running it consumes it (sqlx's `QueryBuilder` runs by reference,
/// which generic code cannot do on SQLite, whose arguments borrow for exactly as long as the
/// query that runs them).
pub(crate) struct Statement<'a, DB: Database> {
    sql: String,
    arguments: DB::Arguments<'a>,
    /// The first value that could not be encoded: reported when the statement runs.
    unbound: Option<BoxDynError>,
}

impl<'a, DB: Dialect> Statement<'a, DB> {
    /// A statement starting with `sql`.
    pub(crate) fn new(sql: &str) -> Self {
        Self {
            sql: sql.to_owned(),
            arguments: DB::Arguments::default(),
            unbound: None,
        }
    }

    /// Appends SQL text.
    pub(crate) fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Binds `value` and appends its placeholder.
    pub(crate) fn value<T>(&mut self, value: T) -> &mut Self
    where
        DB: Bind<'a, T>,
    {
        if let Err(e) = DB::bind(&mut self.arguments, value) {
            self.unbound.get_or_insert(e);
        }
        self.arguments
            .format_placeholder(&mut self.sql)
            .unwrap_or_else(|_| unreachable!("writing to a String cannot fail"));
        self
    }

    /// Binds each of `values`, separated by `, `.
    pub(crate) fn values<T>(&mut self, values: impl IntoIterator<Item = T>) -> &mut Self
    where
        DB: Bind<'a, T>,
    {
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.value(value);
        }
        self
    }

    /// Runs the statement on `connection` and returns how many rows it changed.
    pub(crate) async fn execute(self, connection: &mut DB::Connection) -> Result<u64, sqlx::Error> {
        let (sql, arguments) = self.into_parts()?;
        let done =
            answered::<DB, _>(DB::on(connection).execute(DB::query(&sql, arguments))).await?;
        Ok(DB::rows_affected(&done))
    }

    /// Runs the statement on `connection` and reads the row it returned, if any.
    pub(crate) async fn fetch_optional<R>(
        self,
        connection: &mut DB::Connection,
    ) -> Result<Option<R>, sqlx::Error>
    where
        DB: Reads<R>,
    {
        let (sql, arguments) = self.into_parts()?;
        let row = answered::<DB, _>(DB::on(connection).fetch_optional(DB::query(&sql, arguments)))
            .await?;
        row.as_ref().map(DB::read).transpose()
    }

    /// Runs the statement on `connection` and reads the one row it must return.
    pub(crate) async fn fetch_one<R>(
        self,
        connection: &mut DB::Connection,
    ) -> Result<R, sqlx::Error>
    where
        DB: Reads<R>,
    {
        self.fetch_optional(connection)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs the statement on `connection` and reads every row it returned.
    pub(crate) async fn fetch_all<R>(
        self,
        connection: &mut DB::Connection,
    ) -> Result<Vec<R>, sqlx::Error>
    where
        DB: Reads<R>,
    {
        let (sql, arguments) = self.into_parts()?;
        let rows =
            answered::<DB, _>(DB::on(connection).fetch_all(DB::query(&sql, arguments))).await?;
        rows.iter().map(DB::read).collect()
    }

    fn into_parts(self) -> Result<(String, DB::Arguments<'a>), sqlx::Error> {
        match self.unbound {
            Some(e) => Err(sqlx::Error::Encode(e)),
            None => Ok((self.sql, self.arguments)),
        }
    }
}

/// Waits for `work`, a statement's or a `COMMIT`'s round trip, at most [`Dialect::answer_bound`].
/// Dropped there, the connection is left mid-conversation: the error distrusts it, so it
/// leaves the pool as it comes back.
pub(crate) async fn answered<DB: Dialect, T>(
    work: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    match DB::answer_bound() {
        None => work.await,
        Some(bound) => tokio::time::timeout(bound, work)
            .await
            .unwrap_or_else(|_| Err(no_answer(bound))),
    }
}

pub(crate) use payments_idempotency_sql::no_answer;
