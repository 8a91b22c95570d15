//! Reconciliation: a day of the processor's settlement report matched against the books, by
//! the processor's id. `payments-api reconcile --date YYYY-MM-DD` runs it once; the daily
//! worker (`workers.reconcile_at`) runs it for the previous UTC day.
//!
//! For each line of the day's report:
//! - the books hold its processor id: `matched` if type, amount and currency agree, else
//!   `amount_mismatch`;
//! - they do not, and a pending record holds its processor key: the record is taken over
//!   (once its lock has ended) and settled through the engine, as the completer settles it,
//!   with the processor's answer checked against the request: `settled` when that recorded
//!   it. Never a new charge: the settle only asks the processor what exists under the key. A
//!   record whose lock is live is `in_flight`: its attempt records it;
//! - otherwise `processor_only`.
//!
//! Then every entry the books made that day whose processor id is in none of the reports of
//! the day and the days beside it (the two sides stamp an effect a moment apart, which may fall
//! either side of midnight) is `books_only`. The last three kinds are exceptions, kept for an
//! operator; a second run over the same day adds none it found before, and calls a difference
//! an operator has resolved since (`POST /ops/exceptions/{id}/resolve`) `resolved`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{Days, NaiveDate, NaiveTime, Utc};
use payments_domain::{
    BooksEntry, HeldRecord, ItemResult, ProcessorError, ReconciledItem, SettlementKind,
    SettlementLine, SettlementReport, Sides, TenantId, compare,
};
use payments_idempotency::engine::{Engine, ProtocolError, SettleOutcome};
use payments_storage::{PendingEffect, SavedRun, Store, StoreError, Transaction};

use crate::{error_chain, metrics};

/// Why a run could not be made. Nothing of it is kept.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    #[error("cannot read the processor's settlement report for {date}: {source}")]
    Report {
        date: NaiveDate,
        source: ProcessorError,
    },
    #[error("cannot read or write the books: {0}")]
    Store(#[from] StoreError),
    #[error("the day {0} cannot be reconciled: it is out of range")]
    OutOfRange(NaiveDate),
}

/// A run: every item that is not `matched`, and what was kept.
#[derive(Debug, Clone)]
pub(crate) struct Reconciliation {
    pub(crate) date: NaiveDate,
    /// How many items came out each way, in [`ItemResult::ALL`]'s order.
    pub(crate) counts: Vec<(ItemResult, usize)>,
    /// Every item but the matched ones.
    pub(crate) items: Vec<ReconciledItem>,
    pub(crate) saved: SavedRun,
}

impl Reconciliation {
    /// How many items are exceptions.
    pub(crate) fn exceptions(&self) -> usize {
        self.items
            .iter()
            .filter(|item| item.result.is_exception())
            .count()
    }
}

/// What a run reads and settles through.
#[derive(Debug, Clone)]
pub(crate) struct Reconciler {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) engine: Arc<Engine<Transaction>>,
    pub(crate) report: Arc<dyn SettlementReport>,
}

impl Reconciler {
    /// Reconciles `date` (UTC) and keeps the run.
    pub(crate) async fn run(&self, date: NaiveDate) -> Result<Reconciliation, ReconcileError> {
        let before = date
            .checked_sub_days(Days::new(1))
            .ok_or(ReconcileError::OutOfRange(date))?;
        let after = date
            .checked_add_days(Days::new(1))
            .ok_or(ReconcileError::OutOfRange(date))?;
        let lines = self.read_report(date).await?;
        let mut reported: HashSet<(SettlementKind, String)> = lines
            .iter()
            .map(|line| (line.kind, line.processor_id.clone()))
            .collect();
        for day in [before, after] {
            let beside = self.read_report(day).await?;
            reported.extend(
                beside
                    .into_iter()
                    .map(|line| (line.kind, line.processor_id)),
            );
        }
        let from = before.and_time(NaiveTime::MIN).and_utc();
        let to = after
            .checked_add_days(Days::new(1))
            .ok_or(ReconcileError::OutOfRange(date))?
            .and_time(NaiveTime::MIN)
            .and_utc();
        let mut books: HashMap<(SettlementKind, String), BooksEntry> = self
            .store
            .books_between(from, to)
            .await?
            .into_iter()
            .map(|entry| ((entry.kind, entry.processor_id.clone()), entry))
            .collect();

        let mut items = Vec::new();
        for line in lines {
            let known = books.remove(&(line.kind, line.processor_id.clone()));
            items.push(self.reconcile_line(line, known).await?);
        }
        for ((kind, processor_id), entry) in books {
            if entry.created_at.date_naive() == date && !reported.contains(&(kind, processor_id)) {
                items.push(ReconciledItem {
                    result: ItemResult::BooksOnly,
                    sides: Sides::Books(entry),
                });
            }
        }

        // A difference an operator resolved after an earlier run is not one to look at again.
        let differences: Vec<(SettlementKind, &str)> = items
            .iter()
            .filter(|item| item.result.is_exception())
            .map(|item| (item.sides.kind(), item.sides.processor_id()))
            .collect();
        let resolved = self.store.resolved_among(&differences).await?;
        for item in items.iter_mut().filter(|item| item.result.is_exception()) {
            let difference = (item.sides.kind(), item.sides.processor_id().to_owned());
            if resolved.contains(&difference) {
                item.result = ItemResult::Resolved;
            }
        }

        let counts: Vec<(ItemResult, usize)> = ItemResult::ALL
            .into_iter()
            .map(|result| (result, items.iter().filter(|i| i.result == result).count()))
            .collect();
        // The matched ones are counted, not kept: they need nobody.
        items.retain(|item| item.result != ItemResult::Matched);
        items.sort_by_key(|item| item.result.as_str());
        let saved = self.store.save_reconciliation(date, &items).await?;
        metrics::record_reconciliation(&counts, saved.open_exceptions);
        let run = Reconciliation {
            date,
            counts,
            items,
            saved,
        };
        tracing::info!(reconcile.date = %date, reconcile.items = run.counts.iter().map(|(_, n)| n).sum::<usize>(),
            reconcile.exceptions = run.exceptions(),
            reconcile.exceptions_added = saved.exceptions_added, "reconciliation: run kept");
        Ok(run)
    }

    async fn read_report(&self, date: NaiveDate) -> Result<Vec<SettlementLine>, ReconcileError> {
        self.report
            .settlement_report(date)
            .await
            .map_err(|source| ReconcileError::Report { date, source })
    }

    /// One line of the report, with the books' entry of the days around it if they have one.
    async fn reconcile_line(
        &self,
        line: SettlementLine,
        known: Option<BooksEntry>,
    ) -> Result<ReconciledItem, ReconcileError> {
        let books = match known {
            Some(entry) => Some(entry),
            // Recorded on another day: a record settled late, long after its charge.
            None => {
                self.store
                    .books_entry(line.kind, &line.processor_id)
                    .await?
            }
        };
        if let Some(books) = books {
            return Ok(both(compare(&line, &books), line, books));
        }
        match self
            .store
            .records()
            .take_over_by_effect_key(&line.processor_key)
            .await
            .map_err(StoreError::from)?
        {
            PendingEffect::TakenOver(record) => {
                let settled = self.engine.settle_abandoned(&record).await;
                if let Err(error) = &settled {
                    let error: &ProtocolError = error;
                    tracing::warn!(idempotency.key = %record.key, error = %error_chain(error),
                        "reconciliation: the record could not be settled; left pending");
                }
                match self
                    .store
                    .books_entry(line.kind, &line.processor_id)
                    .await?
                {
                    Some(books) => {
                        let result = match compare(&line, &books) {
                            ItemResult::Matched => ItemResult::Settled,
                            other => other,
                        };
                        Ok(both(result, line, books))
                    }
                    None if matches!(settled, Ok(SettleOutcome::Mismatched)) => {
                        let held = HeldRecord {
                            tenant: TenantId::new(record.scope.tenant.clone()),
                            operation: record.scope.operation.clone(),
                            key: record.key.as_str().to_owned(),
                        };
                        Ok(ReconciledItem {
                            result: ItemResult::ProcessorMismatch,
                            sides: Sides::Pending(line, held),
                        })
                    }
                    None => Ok(processor_only(ItemResult::ProcessorOnly, line)),
                }
            }
            PendingEffect::InFlight => Ok(processor_only(ItemResult::InFlight, line)),
            PendingEffect::None => Ok(processor_only(ItemResult::ProcessorOnly, line)),
        }
    }
}

fn both(result: ItemResult, line: SettlementLine, books: BooksEntry) -> ReconciledItem {
    ReconciledItem {
        result,
        sides: Sides::Both(line, books),
    }
}

fn processor_only(result: ItemResult, line: SettlementLine) -> ReconciledItem {
    ReconciledItem {
        result,
        sides: Sides::Processor(line),
    }
}

/// The previous UTC day, which the daily worker reconciles.
pub(crate) fn yesterday() -> Option<NaiveDate> {
    Utc::now().date_naive().checked_sub_days(Days::new(1))
}

impl Reconciliation {
    /// The run as JSON: the day, the counts, what was kept, and every item but the matched.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let counts: serde_json::Map<String, serde_json::Value> = self
            .counts
            .iter()
            .map(|(result, n)| (result.as_str().to_owned(), (*n).into()))
            .collect();
        let items: Vec<serde_json::Value> = self.items.iter().map(item_json).collect();
        serde_json::json!({
            "date": self.date.to_string(),
            "counts": counts,
            "exceptions": self.exceptions(),
            "exceptions_added": self.saved.exceptions_added,
            "open_exceptions": self.saved.open_exceptions,
            "items": items,
        })
    }

    /// The run as a table for a terminal: the counts, then one row per item but the matched.
    pub(crate) fn to_table(&self) -> String {
        let counts: Vec<String> = self
            .counts
            .iter()
            .map(|(result, n)| format!("{} {n}", result.as_str()))
            .collect();
        let mut out = format!(
            "reconciliation of {}: {}; {} exceptions ({} new, {} open in all)\n",
            self.date,
            counts.join(", "),
            self.exceptions(),
            self.saved.exceptions_added,
            self.saved.open_exceptions
        );
        if self.items.is_empty() {
            return out;
        }
        let rows: Vec<[String; 6]> = self.items.iter().map(item_row).collect();
        let header = [
            "result",
            "type",
            "processor_id",
            "tenant",
            "processor",
            "books",
        ]
        .map(str::to_owned);
        let widths: Vec<usize> = (0..6)
            .map(|c| {
                rows.iter()
                    .chain(std::iter::once(&header))
                    .map(|row| row[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in std::iter::once(&header).chain(rows.iter()) {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

/// Money as `1999 USD`, or `-` for a side that holds nothing.
fn money_cell(money: Option<payments_domain::Money>) -> String {
    money.map_or_else(
        || "-".to_owned(),
        |m| format!("{} {}", m.amount.minor_units(), m.currency.code()),
    )
}

fn item_row(item: &ReconciledItem) -> [String; 6] {
    let sides = &item.sides;
    [
        item.result.as_str().to_owned(),
        sides.kind().as_str().to_owned(),
        sides.processor_id().to_owned(),
        sides
            .tenant()
            .map_or_else(|| "-".to_owned(), |t| t.as_str().to_owned()),
        money_cell(sides.line().map(|line| line.money)),
        money_cell(sides.books().map(|books| books.money)),
    ]
}

fn item_json(item: &ReconciledItem) -> serde_json::Value {
    let sides = &item.sides;
    let processor = sides.line().map(|line| {
        serde_json::json!({
            "processor_key": line.processor_key,
            "amount": line.money.amount.minor_units(),
            "currency": line.money.currency.code(),
            "created_at": line.created_at.to_rfc3339(),
            "metadata": line.metadata.as_ref().map(|m| serde_json::json!({
                "tenant": m.tenant.as_str(), "resource_id": m.resource_id,
            })),
        })
    });
    let books = sides.books().map(|books| {
        serde_json::json!({
            "resource_id": books.resource_id,
            "tenant": books.tenant.as_str(),
            "amount": books.money.amount.minor_units(),
            "currency": books.money.currency.code(),
            "created_at": books.created_at.to_rfc3339(),
        })
    });
    let record = sides.record().map(|record| {
        serde_json::json!({ "operation": record.operation, "idempotency_key": record.key })
    });
    serde_json::json!({
        "result": item.result.as_str(),
        "type": sides.kind().as_str(),
        "processor_id": sides.processor_id(),
        "tenant": sides.tenant().map(|t| t.as_str()),
        "processor": processor,
        "books": books,
        "record": record,
    })
}
