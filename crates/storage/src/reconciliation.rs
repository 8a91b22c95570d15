//! `ReconciliationRepository`: the books as reconciliation reads them (across tenants: it is
//! an operator's job, never a tenant's), and the runs and their exceptions.
//!
//! The books are the `books` view (its migration says what it holds: what the processor made
//! that the ledger holds, and what operators' voids gave back), each row read as a `BooksRow`.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use payments_domain::{
    BooksEntry, ExceptionId, HeldRecord, ItemResult, Money, ReconciledItem, ResolutionAction,
    SettlementKind, TenantId,
};
use payments_idempotency_sql::Connection;
use uuid::Uuid;

use crate::StoreError;
use crate::database::DatabaseStore;
use crate::rows::{corrupt, money, page};
use crate::sql::{Each, Sql};

/// Reconciliation against the processor's settlement report. It reads the
/// books of every tenant: an operator's job, never reachable with a tenant's key.
#[async_trait]
pub trait ReconciliationRepository: Send + Sync {
    /// Everything the books hold with a `created_at` in `[from, to)`.
    async fn books_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<BooksEntry>, StoreError>;

    /// What the books hold under the processor's id `processor_id` of `kind`, whenever it was
    /// made.
    async fn books_entry(
        &self,
        kind: SettlementKind,
        processor_id: &str,
    ) -> Result<Option<BooksEntry>, StoreError>;

    /// Which of `items` (a kind and a processor id each) an operator has resolved the kept
    /// exception of, in as few reads as the database's limit on bound values allows.
    async fn resolved_among(
        &self,
        items: &[(SettlementKind, &str)],
    ) -> Result<HashSet<(SettlementKind, String)>, StoreError>;

    /// Keeps the run of `date`: its counts, replacing an earlier run's, and its exceptions,
    /// adding none the day already holds.
    async fn save_reconciliation(
        &self,
        date: NaiveDate,
        items: &[ReconciledItem],
    ) -> Result<SavedRun, StoreError>;

    /// The exception with this id, whatever its status.
    async fn get_exception(
        &self,
        id: ExceptionId,
    ) -> Result<Option<ReconciliationException>, StoreError>;

    /// A page of the exceptions of one status, oldest first, or `None` when the cursor is not
    /// an exception of that status.
    async fn list_exceptions(
        &self,
        page: ListExceptions,
    ) -> Result<Option<ExceptionPage>, StoreError>;
}

/// Where an exception stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExceptionStatus {
    Open,
    Resolved,
}

impl ExceptionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Resolved => "resolved",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Open, Self::Resolved]
            .into_iter()
            .find(|status| status.as_str() == name)
    }
}

/// A page request of the exceptions of one status: oldest first, after an optional cursor.
#[derive(Debug, Clone, Copy)]
pub struct ListExceptions {
    pub status: ExceptionStatus,
    pub limit: u32,
    pub starting_after: Option<ExceptionId>,
}

/// An exception as it is kept: what each side held of it when the run found it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconciliationException {
    pub id: ExceptionId,
    pub report_date: NaiveDate,
    /// One of the exception results ([`ItemResult::is_exception`]).
    pub kind: ItemResult,
    pub status: ExceptionStatus,
    pub created_at: DateTime<Utc>,
    pub effect: SettlementKind,
    pub processor_id: String,
    pub tenant: Option<TenantId>,
    /// The processor's line, if the processor reported it.
    pub processor: Option<ProcessorSide>,
    /// The books' side, if the books hold it.
    pub books: Option<BooksSide>,
    /// The pending record a mismatch holds.
    pub record: Option<HeldRecord>,
    /// The service's id of it (`ch_…`, `re_…`, `po_…`): the books', or the one the processor's
    /// metadata names.
    pub resource_id: Option<String>,
    /// How an operator resolved it, once resolved.
    pub resolution: Option<Resolution>,
}

/// How an operator resolved an exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub action: ResolutionAction,
    /// The operator key's name.
    pub operator: String,
    pub note: String,
    pub resolved_at: DateTime<Utc>,
    /// `record`: the service's id of what it posted.
    pub recorded_id: Option<String>,
    /// `void`: the processor's id of what it gave back.
    pub void_processor_id: Option<String>,
}

/// What the processor's line of an exception said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorSide {
    pub processor_key: String,
    pub money: Money,
}

/// What the books held of an exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BooksSide {
    /// The service's id of it (`ch_…`, `re_…`, `po_…`).
    pub resource_id: String,
    pub money: Money,
}

/// One page of exceptions, oldest first.
#[derive(Debug, Clone)]
pub struct ExceptionPage {
    pub exceptions: Vec<ReconciliationException>,
    pub has_more: bool,
}

/// What saving a reconciliation run changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedRun {
    /// Exceptions the run added; a second run over the same day adds none it found before.
    pub exceptions_added: u64,
    /// Exceptions still open, over every day.
    pub open_exceptions: i64,
}

/// A row of the `books` view: an effect the processor made, as reconciliation reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct BooksRow {
    kind: String,
    id: Uuid,
    tenant_id: String,
    processor_id: String,
    amount: i64,
    currency: String,
    created_at: DateTime<Utc>,
}

impl BooksRow {
    pub(crate) fn into_entry(self) -> Result<BooksEntry, StoreError> {
        let kind = SettlementKind::parse(&self.kind).ok_or_else(|| corrupt("kind", &self.kind))?;
        Ok(BooksEntry {
            kind,
            processor_id: self.processor_id,
            tenant: TenantId::new(self.tenant_id),
            resource_id: kind.resource_id(self.id),
            money: money(self.amount, &self.currency)?,
            created_at: self.created_at,
        })
    }
}

/// A `reconciliation_exceptions` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ExceptionRow {
    id: Uuid,
    report_date: NaiveDate,
    kind: String,
    status: String,
    created_at: DateTime<Utc>,
    effect: String,
    processor_id: String,
    processor_key: Option<String>,
    tenant_id: Option<String>,
    resource_id: Option<String>,
    processor_amount: Option<i64>,
    processor_currency: Option<String>,
    books_amount: Option<i64>,
    books_currency: Option<String>,
    record_operation: Option<String>,
    record_key: Option<String>,
    action: Option<String>,
    operator: Option<String>,
    note: Option<String>,
    resolved_at: Option<DateTime<Utc>>,
    recorded_id: Option<String>,
    void_processor_id: Option<String>,
}

impl ExceptionRow {
    pub(crate) fn into_exception(self) -> Result<ReconciliationException, StoreError> {
        let tenant = self.tenant_id.map(TenantId::new);
        let processor = match (
            self.processor_key,
            self.processor_amount,
            self.processor_currency,
        ) {
            (Some(processor_key), Some(amount), Some(currency)) => Some(ProcessorSide {
                processor_key,
                money: money(amount, &currency)?,
            }),
            _ => None,
        };
        let books = match (&self.resource_id, self.books_amount, self.books_currency) {
            (Some(resource_id), Some(amount), Some(currency)) => Some(BooksSide {
                resource_id: resource_id.clone(),
                money: money(amount, &currency)?,
            }),
            _ => None,
        };
        let record = match (&tenant, self.record_operation, self.record_key) {
            (Some(tenant), Some(operation), Some(key)) => Some(HeldRecord {
                tenant: tenant.clone(),
                operation,
                key,
            }),
            _ => None,
        };
        let resolution = match (self.action, self.operator, self.note, self.resolved_at) {
            (Some(action), Some(operator), Some(note), Some(resolved_at)) => Some(Resolution {
                action: ResolutionAction::parse(&action)
                    .ok_or_else(|| corrupt("action", &action))?,
                operator,
                note,
                resolved_at,
                recorded_id: self.recorded_id,
                void_processor_id: self.void_processor_id,
            }),
            _ => None,
        };
        Ok(ReconciliationException {
            id: ExceptionId::from_uuid(self.id),
            report_date: self.report_date,
            kind: ItemResult::parse(&self.kind)
                .filter(|kind| kind.is_exception())
                .ok_or_else(|| corrupt("kind", &self.kind))?,
            status: ExceptionStatus::parse(&self.status)
                .ok_or_else(|| corrupt("status", &self.status))?,
            created_at: self.created_at,
            effect: SettlementKind::parse(&self.effect)
                .ok_or_else(|| corrupt("effect", &self.effect))?,
            processor_id: self.processor_id,
            tenant,
            processor,
            books,
            record,
            resource_id: self.resource_id,
            resolution,
        })
    }
}

/// A page of exceptions, like [`charge_page`].
fn exception_page(rows: Vec<ExceptionRow>, limit: u32) -> Result<ExceptionPage, StoreError> {
    let (exceptions, has_more) = page(rows, limit, ExceptionRow::into_exception)?;
    Ok(ExceptionPage {
        exceptions,
        has_more,
    })
}

/// Everything the books hold made in `[$1, $2)`.
const BOOKS_BETWEEN: &str = "
SELECT kind, id, tenant_id, processor_id, amount, currency, created_at FROM books
WHERE created_at >= $1 AND created_at < $2";

/// What the books hold of kind `$1` that the processor knows as `$2`.
const BOOKS_ENTRY: &str = "
SELECT kind, id, tenant_id, processor_id, amount, currency, created_at FROM books
WHERE kind = $1 AND processor_id = $2";

/// The resolved exceptions among the processor ids of the JSON array `$1`.
const RESOLVED_AMONG: Each = Each {
    postgres: "
SELECT effect, processor_id FROM reconciliation_exceptions
WHERE status = 'resolved' AND processor_id IN (SELECT jsonb_array_elements_text($1))",
    sqlite: "
SELECT effect, processor_id FROM reconciliation_exceptions
WHERE status = 'resolved' AND processor_id IN (SELECT value FROM json_each($1))",
};

/// A run's counts, replacing an earlier run's of the same day.
const SAVE_RUN: &str = "
INSERT INTO reconciliation_runs (report_date, ran_at, matched, settled, in_flight, exceptions)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (report_date) DO UPDATE SET ran_at = excluded.ran_at, matched = excluded.matched,
    settled = excluded.settled, in_flight = excluded.in_flight, exceptions = excluded.exceptions";

/// An exception of a run, unless the day holds it already (`reconciliation_exceptions_once`),
/// resolved or not.
const INSERT_EXCEPTION: &str = "
INSERT INTO reconciliation_exceptions
    (id, report_date, kind, effect, processor_id, processor_key, tenant_id, resource_id,
     processor_amount, processor_currency, books_amount, books_currency, record_operation,
     record_key, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (report_date, kind, processor_id) DO NOTHING";

const OPEN_EXCEPTIONS: &str =
    "SELECT count(*) FROM reconciliation_exceptions WHERE status = 'open'";

/// An exception and its resolution, if any; the resolution's columns are named apart from the
/// exception's.
pub(crate) const EXCEPTION: &str = "
SELECT id, report_date, kind, status, created_at, effect, processor_id, processor_key,
       tenant_id, resource_id, processor_amount, processor_currency, books_amount,
       books_currency, record_operation, record_key, action, operator, note, resolved_at,
       recorded_id, void_processor_id
FROM reconciliation_exceptions LEFT JOIN reconciliation_resolutions ON exception_id = id
WHERE id = $1";

/// The first `$2` exceptions of status `$1`, oldest first.
const EXCEPTIONS: &str = "
SELECT id, report_date, kind, status, created_at, effect, processor_id, processor_key,
       tenant_id, resource_id, processor_amount, processor_currency, books_amount,
       books_currency, record_operation, record_key, action, operator, note, resolved_at,
       recorded_id, void_processor_id
FROM reconciliation_exceptions LEFT JOIN reconciliation_resolutions ON exception_id = id
WHERE status = $1
ORDER BY created_at, id LIMIT $2";

/// The same, after the exception made at `$2` with id `$3`.
const EXCEPTIONS_AFTER: &str = "
SELECT id, report_date, kind, status, created_at, effect, processor_id, processor_key,
       tenant_id, resource_id, processor_amount, processor_currency, books_amount,
       books_currency, record_operation, record_key, action, operator, note, resolved_at,
       recorded_id, void_processor_id
FROM reconciliation_exceptions LEFT JOIN reconciliation_resolutions ON exception_id = id
WHERE status = $1 AND (created_at, id) > ($2, $3)
ORDER BY created_at, id LIMIT $4";

#[async_trait]
impl ReconciliationRepository for DatabaseStore {
    async fn books_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<BooksEntry>, StoreError> {
        let mut connection = self.acquire().await?;
        let rows: Vec<BooksRow> = Sql::new(BOOKS_BETWEEN)
            .bind(from)
            .bind(to)
            .fetch_all(&mut connection.connection())
            .await?;
        rows.into_iter().map(BooksRow::into_entry).collect()
    }

    async fn books_entry(
        &self,
        kind: SettlementKind,
        processor_id: &str,
    ) -> Result<Option<BooksEntry>, StoreError> {
        let mut connection = self.acquire().await?;
        let row: Option<BooksRow> = Sql::new(BOOKS_ENTRY)
            .bind(kind.as_str())
            .bind(processor_id)
            .fetch_optional(&mut connection.connection())
            .await?;
        row.map(BooksRow::into_entry).transpose()
    }

    async fn resolved_among(
        &self,
        items: &[(SettlementKind, &str)],
    ) -> Result<HashSet<(SettlementKind, String)>, StoreError> {
        if items.is_empty() {
            return Ok(HashSet::new());
        }
        let processor_ids: Vec<&str> = items.iter().map(|(_, id)| *id).collect();
        let mut connection = self.acquire().await?;
        let rows: Vec<(String, String)> = Sql::new(RESOLVED_AMONG)
            .bind(serde_json::json!(processor_ids))
            .fetch_all(&mut connection.connection())
            .await?;
        let found = rows.into_iter().filter_map(|(effect, processor_id)| {
            Some((SettlementKind::parse(&effect)?, processor_id))
        });
        let asked: HashSet<(SettlementKind, &str)> = items.iter().copied().collect();
        Ok(found
            .filter(|(kind, id)| asked.contains(&(*kind, id.as_str())))
            .collect())
    }

    /// The run's row is replaced; its exceptions are added unless the day already holds the
    /// same one, resolved or not. All in one transaction.
    async fn save_reconciliation(
        &self,
        date: NaiveDate,
        items: &[ReconciledItem],
    ) -> Result<SavedRun, StoreError> {
        let count = |result: ItemResult| {
            i64::try_from(items.iter().filter(|item| item.result == result).count())
                .unwrap_or(i64::MAX)
        };
        let exceptions = items.iter().filter(|item| item.result.is_exception());
        // The service's clock, as for every time a list pages on.
        let now = Utc::now();
        let mut write = self.begin_write().await?;
        let mut connection = write.connection();
        Sql::new(SAVE_RUN)
            .bind(date)
            .bind(now)
            .bind(count(ItemResult::Matched))
            .bind(count(ItemResult::Settled))
            .bind(count(ItemResult::InFlight))
            .bind(i64::try_from(exceptions.clone().count()).unwrap_or(i64::MAX))
            .execute(&mut connection)
            .await?;
        let mut added = 0;
        for item in exceptions {
            added += insert_exception(&mut connection, date, now, item).await?;
        }
        write.commit().await?;
        let mut connection = self.acquire().await?;
        let (open,): (i64,) = Sql::new(OPEN_EXCEPTIONS)
            .fetch_one(&mut connection.connection())
            .await?;
        Ok(SavedRun {
            exceptions_added: added,
            open_exceptions: open,
        })
    }

    async fn get_exception(
        &self,
        id: ExceptionId,
    ) -> Result<Option<ReconciliationException>, StoreError> {
        let mut connection = self.acquire().await?;
        let row: Option<ExceptionRow> = Sql::new(EXCEPTION)
            .bind(id.as_uuid())
            .fetch_optional(&mut connection.connection())
            .await?;
        row.map(ExceptionRow::into_exception).transpose()
    }

    /// Keyset pagination on `(created_at, id)`, oldest first.
    async fn list_exceptions(
        &self,
        page: ListExceptions,
    ) -> Result<Option<ExceptionPage>, StoreError> {
        let sql = match page.starting_after {
            None => Sql::new(EXCEPTIONS).bind(page.status.as_str()),
            Some(id) => match self.get_exception(id).await? {
                Some(cursor) if cursor.status == page.status => Sql::new(EXCEPTIONS_AFTER)
                    .bind(page.status.as_str())
                    .bind(cursor.created_at)
                    .bind(cursor.id.as_uuid()),
                _ => return Ok(None),
            },
        };
        let mut connection = self.acquire().await?;
        let rows: Vec<ExceptionRow> = sql
            .bind(i64::from(page.limit) + 1)
            .fetch_all(&mut connection.connection())
            .await?;
        exception_page(rows, page.limit).map(Some)
    }
}

/// Inserts `item` as an exception of the run of `date`, unless the day holds it already;
/// returns how many rows it added (0 or 1).
async fn insert_exception(
    connection: &mut Connection<'_>,
    date: NaiveDate,
    created_at: DateTime<Utc>,
    item: &ReconciledItem,
) -> Result<u64, StoreError> {
    let sides = &item.sides;
    let line = sides.line();
    let books = sides.books();
    let metadata = line.and_then(|line| line.metadata.as_ref());
    let resource_id = books
        .map(|books| books.resource_id.clone())
        .or_else(|| metadata.map(|m| m.resource_id.clone()));
    let record = sides.record();
    let added = Sql::new(INSERT_EXCEPTION)
        .bind(Uuid::now_v7())
        .bind(date)
        .bind(item.result.as_str())
        .bind(sides.kind().as_str())
        .bind(sides.processor_id())
        .bind(line.map(|line| line.processor_key.as_str()))
        .bind(sides.tenant().map(|tenant| tenant.as_str()))
        .bind(resource_id.as_deref())
        .bind(line.map(|line| line.money.amount.minor_units()))
        .bind(line.map(|line| line.money.currency.code()))
        .bind(books.map(|books| books.money.amount.minor_units()))
        .bind(books.map(|books| books.money.currency.code()))
        .bind(record.map(|record| record.operation.as_str()))
        .bind(record.map(|record| record.key.as_str()))
        .bind(created_at)
        .execute(connection)
        .await?;
    Ok(added)
}
