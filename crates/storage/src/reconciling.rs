//! `ReconciliationRepository`: the books as reconciliation reads them (across tenants: it is
//! an operator's job, never a tenant's), and the runs and their exceptions.
//!
//! The books hold every charge, every succeeded refund and every paid payout, and what
//! operators' voids gave back (a void is kept in its resolution, so the processor's report of
//! it matches), each as a `BooksRow`.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use payments_domain::{BooksEntry, ExceptionId, ItemResult, ReconciledItem, SettlementKind};
use payments_idempotency_sql::Connection;
use uuid::Uuid;

use crate::StoreError;
use crate::model::{ExceptionPage, ListExceptions, ReconciliationException, SavedRun};
use crate::repository::ReconciliationRepository;
use crate::rows::{self, BooksRow, ExceptionRow};
use crate::sql::{Each, Sql};
use crate::store::DatabaseStore;

/// Everything the books hold made in `[$1, $2)`.
const BOOKS_BETWEEN: &str = "
SELECT 'charge' AS kind, id, tenant_id, processor_charge_id AS processor_id, amount, currency,
       created_at
FROM charges WHERE created_at >= $1 AND created_at < $2
UNION ALL
SELECT 'refund', id, tenant_id, processor_refund_id, amount, currency, created_at
FROM refunds WHERE status = 'succeeded' AND created_at >= $1 AND created_at < $2
UNION ALL
SELECT 'payout', id, tenant_id, processor_payout_id, amount, currency, created_at
FROM payouts WHERE status = 'paid' AND created_at >= $1 AND created_at < $2
UNION ALL
SELECT 'refund', exception_id, COALESCE(void_tenant_id, ''), void_processor_id, void_amount,
       void_currency, resolved_at
FROM reconciliation_resolutions
WHERE void_processor_id IS NOT NULL AND resolved_at >= $1 AND resolved_at < $2";

/// The charge the processor knows as `$1`.
const BOOKS_CHARGE: &str = "
SELECT 'charge' AS kind, id, tenant_id, processor_charge_id AS processor_id, amount, currency,
       created_at
FROM charges WHERE processor_charge_id = $1";

/// The succeeded refund, or the operator's void, the processor knows as `$1`.
const BOOKS_REFUND: &str = "
SELECT 'refund' AS kind, id, tenant_id, processor_refund_id AS processor_id, amount, currency,
       created_at
FROM refunds WHERE status = 'succeeded' AND processor_refund_id = $1
UNION ALL
SELECT 'refund', exception_id, COALESCE(void_tenant_id, ''), void_processor_id, void_amount,
       void_currency, resolved_at
FROM reconciliation_resolutions WHERE void_processor_id = $1";

/// The paid payout the processor knows as `$1`.
const BOOKS_PAYOUT: &str = "
SELECT 'payout' AS kind, id, tenant_id, processor_payout_id AS processor_id, amount, currency,
       created_at
FROM payouts WHERE status = 'paid' AND processor_payout_id = $1";

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
        let statement = match kind {
            SettlementKind::Charge => BOOKS_CHARGE,
            SettlementKind::Refund => BOOKS_REFUND,
            SettlementKind::Payout => BOOKS_PAYOUT,
        };
        let mut connection = self.acquire().await?;
        let row: Option<BooksRow> = Sql::new(statement)
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
        rows::exception_page(rows, page.limit).map(Some)
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
        .bind(Uuid::new_v4())
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
