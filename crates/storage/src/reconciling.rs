//! `ReconciliationRepository`, written once for both backends over any [`SqlStore`]: the
//! books as reconciliation reads them (across tenants: it is an operator's job, never a
//! tenant's), the takeover of a pending record the processor's report shows was made, and
//! the runs and their exceptions.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use payments_domain::{ExceptionId, ItemResult, ReconciledItem, SettlementKind};
use uuid::Uuid;

use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::model::{ExceptionPage, ListExceptions, ReconciliationException, SavedRun};
use crate::repository::ReconciliationRepository;
use crate::rows::{self, BooksRow, ExceptionRow};
use crate::sql_store::SqlStore;

/// Each kind of effect's table, its processor id column, and what makes a row of it made.
fn books_table(kind: SettlementKind) -> (&'static str, &'static str, &'static str) {
    match kind {
        SettlementKind::Charge => ("charges", "processor_charge_id", "TRUE"),
        SettlementKind::Refund => ("refunds", "processor_refund_id", "status = 'succeeded'"),
        SettlementKind::Payout => ("payouts", "processor_payout_id", "status = 'paid'"),
    }
}

/// `SELECT` of the made rows of `kind`'s table, as [`BooksRow`]s, up to its `WHERE` condition.
fn push_books<DB: Dialect>(sql: &mut Statement<'_, DB>, kind: SettlementKind) {
    let (table, processor_id, made) = books_table(kind);
    sql.push("SELECT '")
        .push(kind.as_str())
        .push("' AS kind, id, tenant_id, ")
        .push(processor_id)
        .push(" AS processor_id, amount, currency, created_at FROM ")
        .push(table)
        .push(" WHERE ")
        .push(made);
}

/// How many processor ids one read of [`ReconciliationRepository::resolved_among`] binds.
const RESOLVED_CHUNK: usize = 500;

/// `SELECT` of what operators' voids gave back, as [`BooksEntry`]s of refunds, up to its
/// `WHERE` condition: the books hold a void in its resolution, so the processor's report of it
/// matches.
fn push_voids<DB: Dialect>(sql: &mut Statement<'_, DB>) {
    sql.push(
        "SELECT 'refund' AS kind, exception_id AS id, COALESCE(void_tenant_id, '') AS tenant_id, \
         void_processor_id AS processor_id, void_amount AS amount, void_currency AS currency, \
         resolved_at AS created_at FROM reconciliation_resolutions \
         WHERE void_processor_id IS NOT NULL",
    );
}

#[async_trait]
impl<S: SqlStore> ReconciliationRepository for S {
    async fn books_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<payments_domain::BooksEntry>, StoreError> {
        let mut sql = Statement::<S::Db>::new("");
        for (i, kind) in SettlementKind::ALL.into_iter().enumerate() {
            if i > 0 {
                sql.push(" UNION ALL ");
            }
            push_books(&mut sql, kind);
            sql.push(" AND created_at >= ");
            S::Db::push_time(&mut sql, from);
            sql.push(" AND created_at < ");
            S::Db::push_time(&mut sql, to);
        }
        sql.push(" UNION ALL ");
        push_voids(&mut sql);
        sql.push(" AND resolved_at >= ");
        S::Db::push_time(&mut sql, from);
        sql.push(" AND resolved_at < ");
        S::Db::push_time(&mut sql, to);
        let mut connection = self.pool().acquire().await?;
        let rows: Vec<BooksRow> = sql.fetch_all(&mut connection).await?;
        rows.into_iter().map(BooksRow::into_entry).collect()
    }

    async fn books_entry(
        &self,
        kind: SettlementKind,
        processor_id: &str,
    ) -> Result<Option<payments_domain::BooksEntry>, StoreError> {
        let mut sql = Statement::<S::Db>::new("");
        push_books(&mut sql, kind);
        let (_, column, _) = books_table(kind);
        sql.push(" AND ")
            .push(column)
            .push(" = ")
            .value(processor_id);
        if kind == SettlementKind::Refund {
            sql.push(" UNION ALL ");
            push_voids(&mut sql);
            sql.push(" AND void_processor_id = ").value(processor_id);
        }
        let mut connection = self.pool().acquire().await?;
        let row: Option<BooksRow> = sql.fetch_optional(&mut connection).await?;
        row.map(BooksRow::into_entry).transpose()
    }

    async fn resolved_among(
        &self,
        items: &[(SettlementKind, &str)],
    ) -> Result<HashSet<(SettlementKind, String)>, StoreError> {
        let mut resolved = HashSet::new();
        if items.is_empty() {
            return Ok(resolved);
        }
        let mut connection = self.pool().acquire().await?;
        // SQLite binds at most 32,766 values in one statement: a large run asks in chunks.
        for chunk in items.chunks(RESOLVED_CHUNK) {
            let mut sql = Statement::<S::Db>::new(
                "SELECT effect, processor_id FROM reconciliation_exceptions \
                 WHERE status = 'resolved' AND processor_id IN (",
            );
            sql.values(chunk.iter().map(|(_, processor_id)| *processor_id))
                .push(")");
            let rows: Vec<(String, String)> = sql.fetch_all(&mut connection).await?;
            let found = rows.into_iter().filter_map(|(effect, processor_id)| {
                Some((SettlementKind::parse(&effect)?, processor_id))
            });
            resolved.extend(found.filter(|(kind, id)| chunk.contains(&(*kind, id.as_str()))));
        }
        Ok(resolved)
    }

    /// The run's row is replaced; its exceptions are added unless the day already holds the
    /// same one (`reconciliation_exceptions_once`), resolved or not. All in one transaction.
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
        // The service's clock, as for every time a list pages on (`push_time` writes it in
        // the form the keyset compares, on SQLite too).
        let now = Utc::now();
        let mut write = self.begin_write().await?;
        let mut run = Statement::<S::Db>::new(
            "INSERT INTO reconciliation_runs
                 (report_date, ran_at, matched, settled, in_flight, exceptions) VALUES (",
        );
        run.value(date).push(", ");
        S::Db::push_time(&mut run, now);
        run.push(", ").values([
            count(ItemResult::Matched),
            count(ItemResult::Settled),
            count(ItemResult::InFlight),
            i64::try_from(exceptions.clone().count()).unwrap_or(i64::MAX),
        ]);
        run.push(
            ") ON CONFLICT (report_date) DO UPDATE SET ran_at = excluded.ran_at,
                 matched = excluded.matched, settled = excluded.settled,
                 in_flight = excluded.in_flight, exceptions = excluded.exceptions",
        );
        run.execute(&mut write).await?;
        let mut added = 0;
        for item in exceptions {
            added += insert_exception::<S::Db>(&mut write, date, now, item).await?;
        }
        S::commit(write).await?;
        let mut connection = self.pool().acquire().await?;
        let (open,): (i64,) = Statement::<S::Db>::new(
            "SELECT count(*) FROM reconciliation_exceptions WHERE status = 'open'",
        )
        .fetch_one(&mut connection)
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
        let mut sql = Statement::<S::Db>::new(SELECT_EXCEPTIONS);
        sql.push(" WHERE id = ").value(id.as_uuid());
        let mut connection = self.pool().acquire().await?;
        let row: Option<ExceptionRow> = sql.fetch_optional(&mut connection).await?;
        row.map(ExceptionRow::into_exception).transpose()
    }

    /// Keyset pagination on `(created_at, id)`, oldest first.
    async fn list_exceptions(
        &self,
        page: ListExceptions,
    ) -> Result<Option<ExceptionPage>, StoreError> {
        let cursor = match page.starting_after {
            Some(id) => match self.get_exception(id).await? {
                Some(cursor) if cursor.status == page.status => Some(cursor),
                _ => return Ok(None),
            },
            None => None,
        };
        let mut sql = Statement::<S::Db>::new(SELECT_EXCEPTIONS);
        sql.push(" WHERE status = ").value(page.status.as_str());
        if let Some(cursor) = &cursor {
            sql.push(" AND (created_at, id) > (");
            S::Db::push_time(&mut sql, cursor.created_at);
            sql.push(", ").value(cursor.id.as_uuid()).push(")");
        }
        sql.push(" ORDER BY created_at, id LIMIT ")
            .value(i64::from(page.limit) + 1);
        let mut connection = self.pool().acquire().await?;
        let rows: Vec<ExceptionRow> = sql.fetch_all(&mut connection).await?;
        rows::exception_page(rows, page.limit).map(Some)
    }
}

/// An exception and its resolution, if any; the resolution's columns are named apart from the
/// exception's, so the conditions callers add (`id`, `status`, `created_at`) are the
/// exception's.
pub(crate) const SELECT_EXCEPTIONS: &str = "SELECT id, report_date, kind, status, created_at, \
     effect, processor_id, processor_key, tenant_id, resource_id, processor_amount, \
     processor_currency, books_amount, books_currency, record_operation, record_key, action, \
     operator, note, resolved_at, recorded_id, void_processor_id FROM reconciliation_exceptions \
     LEFT JOIN reconciliation_resolutions ON exception_id = id";

/// Inserts `item` as an exception of the run of `date`, unless the day holds it already;
/// returns how many rows it added (0 or 1).
async fn insert_exception<DB: Dialect>(
    connection: &mut DB::Connection,
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
    let mut sql = Statement::<DB>::new(
        "INSERT INTO reconciliation_exceptions
             (id, report_date, kind, effect, processor_id, processor_key, tenant_id, resource_id,
              processor_amount, processor_currency, books_amount, books_currency,
              record_operation, record_key, created_at)
         VALUES (",
    );
    sql.value(Uuid::new_v4())
        .push(", ")
        .value(date)
        .push(", ")
        .values([item.result.as_str(), sides.kind().as_str()])
        .push(", ")
        .value(sides.processor_id().to_owned())
        .push(", ")
        .value(line.map(|line| line.processor_key.as_str()))
        .push(", ")
        .value(sides.tenant().map(|tenant| tenant.as_str()))
        .push(", ")
        .value(resource_id.as_deref())
        .push(", ")
        .value(line.map(|line| line.money.amount.minor_units()))
        .push(", ")
        .value(line.map(|line| line.money.currency.code()))
        .push(", ")
        .value(books.map(|books| books.money.amount.minor_units()))
        .push(", ")
        .value(books.map(|books| books.money.currency.code()))
        .push(", ")
        .value(sides.record().map(|record| record.operation.as_str()))
        .push(", ")
        .value(sides.record().map(|record| record.key.as_str()))
        .push(", ");
    DB::push_time(&mut sql, created_at);
    sql.push(") ON CONFLICT (report_date, kind, processor_id) DO NOTHING");
    Ok(sql.execute(connection).await?)
}
