//! Reconciliation: the processor's settlement report matched against the books, line by line,
//! by the processor's id. What this module decides is pure; reading the two sides and settling
//! a pending record are the service's.

use chrono::{DateTime, Utc};

use crate::{Money, SettlementKind, SettlementLine, TenantId};

/// Something the books recorded as made at the processor: a charge, a succeeded refund or a
/// paid payout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BooksEntry {
    pub kind: SettlementKind,
    /// The processor's id the books recorded it under.
    pub processor_id: String,
    pub tenant: TenantId,
    /// The service's public id of it (`ch_…`, `re_…`, `po_…`).
    pub resource_id: String,
    pub money: Money,
    pub created_at: DateTime<Utc>,
}

/// How one item of a run came out. The last three are exceptions, for a person to resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ItemResult {
    /// The processor's line and the books agree on type, amount and currency.
    Matched,
    /// The processor made it and its record was still pending: the run settled the record
    /// through the engine's finish, and the books now hold it.
    Settled,
    /// The processor made it and its record is pending under a live lock: the attempt that
    /// holds it (or the completer after it) records it. Not an exception.
    InFlight,
    /// The processor made it and the books have nothing of it, nor a record that could
    /// still record it.
    ProcessorOnly,
    /// The books hold it and the processor's report does not.
    BooksOnly,
    /// Both hold it, for other money or as another type.
    AmountMismatch,
    /// The processor made it under a pending record's key, and its answer is not what the
    /// record asked for: never recorded, the record is held until a person resolves it.
    ProcessorMismatch,
    /// A difference an earlier run kept as an exception, which an operator has resolved
    /// (accepted, or voided at the processor): nobody need look at it again. Not an exception.
    Resolved,
}

impl ItemResult {
    pub const ALL: [Self; 8] = [
        Self::Matched,
        Self::Settled,
        Self::InFlight,
        Self::ProcessorOnly,
        Self::BooksOnly,
        Self::AmountMismatch,
        Self::ProcessorMismatch,
        Self::Resolved,
    ];

    /// The name in output, in storage and as the `result` label of
    /// `reconciliation_items_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Matched => "matched",
            Self::Settled => "settled",
            Self::InFlight => "in_flight",
            Self::ProcessorOnly => "processor_only",
            Self::BooksOnly => "books_only",
            Self::AmountMismatch => "amount_mismatch",
            Self::ProcessorMismatch => "processor_mismatch",
            Self::Resolved => "resolved",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|result| result.as_str() == name)
    }

    /// Whether a person must look at it.
    pub fn is_exception(self) -> bool {
        matches!(
            self,
            Self::ProcessorOnly | Self::BooksOnly | Self::AmountMismatch | Self::ProcessorMismatch
        )
    }
}

/// A pending idempotency record, named as the books know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRecord {
    pub tenant: TenantId,
    pub operation: String,
    pub key: String,
}

/// What a run found of one processor id: the processor's line, the books' entry, both, or the
/// line and the pending record it was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sides {
    Processor(SettlementLine),
    Books(BooksEntry),
    Both(SettlementLine, BooksEntry),
    Pending(SettlementLine, HeldRecord),
}

impl Sides {
    pub fn kind(&self) -> SettlementKind {
        match self {
            Self::Processor(line) | Self::Both(line, _) | Self::Pending(line, _) => line.kind,
            Self::Books(books) => books.kind,
        }
    }

    pub fn processor_id(&self) -> &str {
        match self {
            Self::Processor(line) | Self::Both(line, _) | Self::Pending(line, _) => {
                &line.processor_id
            }
            Self::Books(books) => &books.processor_id,
        }
    }

    pub fn line(&self) -> Option<&SettlementLine> {
        match self {
            Self::Processor(line) | Self::Both(line, _) | Self::Pending(line, _) => Some(line),
            Self::Books(_) => None,
        }
    }

    pub fn books(&self) -> Option<&BooksEntry> {
        match self {
            Self::Books(books) | Self::Both(_, books) => Some(books),
            Self::Processor(_) | Self::Pending(..) => None,
        }
    }

    /// The pending record the processor's line was made for, if that is what the books hold.
    pub fn record(&self) -> Option<&HeldRecord> {
        match self {
            Self::Pending(_, record) => Some(record),
            _ => None,
        }
    }

    /// The tenant: the books' when they know it, else the one the processor's metadata names.
    pub fn tenant(&self) -> Option<&TenantId> {
        self.books()
            .map(|books| &books.tenant)
            .or_else(|| self.record().map(|record| &record.tenant))
            .or_else(|| Some(&self.line()?.metadata.as_ref()?.tenant))
    }
}

/// One item of a run: how it came out, and what each side holds of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconciledItem {
    pub result: ItemResult,
    pub sides: Sides,
}

/// A line of the report and the books' entry with the same processor id: matched only if
/// they agree on type, amount and currency.
pub fn compare(line: &SettlementLine, books: &BooksEntry) -> ItemResult {
    if line.kind == books.kind && line.money == books.money {
        ItemResult::Matched
    } else {
        ItemResult::AmountMismatch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Amount, Currency, ProcessorChargeStatus};

    fn money(minor_units: i64) -> Money {
        Money::new(
            Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}")),
            Currency::Usd,
        )
    }

    fn line(kind: SettlementKind, minor_units: i64) -> SettlementLine {
        SettlementLine {
            kind,
            processor_id: "ch_sim_1".into(),
            processor_key: "key".into(),
            money: money(minor_units),
            status: ProcessorChargeStatus::Succeeded,
            created_at: DateTime::UNIX_EPOCH,
            metadata: None,
        }
    }

    fn books(kind: SettlementKind, minor_units: i64) -> BooksEntry {
        BooksEntry {
            kind,
            processor_id: "ch_sim_1".into(),
            tenant: TenantId::new("acme"),
            resource_id: "ch_1".into(),
            money: money(minor_units),
            created_at: DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_line_matches_only_the_same_type_and_money() {
        let charge = SettlementKind::Charge;
        assert_eq!(
            compare(&line(charge, 500), &books(charge, 500)),
            ItemResult::Matched
        );
        assert_eq!(
            compare(&line(charge, 501), &books(charge, 500)),
            ItemResult::AmountMismatch
        );
        assert_eq!(
            compare(&line(SettlementKind::Refund, 500), &books(charge, 500)),
            ItemResult::AmountMismatch
        );
    }

    #[test]
    fn result_names_round_trip_and_only_differences_are_exceptions() {
        for result in ItemResult::ALL {
            assert_eq!(ItemResult::parse(result.as_str()), Some(result));
        }
        let exceptions: Vec<_> = ItemResult::ALL
            .into_iter()
            .filter(|result| result.is_exception())
            .map(ItemResult::as_str)
            .collect();
        assert_eq!(
            exceptions,
            [
                "processor_only",
                "books_only",
                "amount_mismatch",
                "processor_mismatch"
            ]
        );
    }
}
