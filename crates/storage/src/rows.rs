//! Database rows and their conversion into protocol and domain types.

use chrono::{DateTime, NaiveDate, Utc};
use payments_domain::{
    Account, Amount, BooksEntry, Charge, ChargeId, Currency, Description, Destination, EventId,
    EventType, ExceptionId, HeldRecord, ItemResult, Money, PaymentSource, Payout, PayoutId,
    PayoutStatus, Refund, RefundId, RefundReason, RefundStatus, ResolutionAction, SettlementKind,
    TenantId,
};
use uuid::Uuid;

use crate::StoreError;
use crate::model::{
    Balance, BooksSide, ChargePage, EventPage, ExceptionPage, ExceptionStatus, Funds, PayoutPage,
    ProcessorSide, ReconciliationException, RefundPage, Resolution, StoredEvent,
};

/// A `charges` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ChargeRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub amount: i64,
    pub currency: String,
    pub source: String,
    pub description: Option<String>,
    pub processor_charge_id: String,
    pub created_at: DateTime<Utc>,
    pub amount_refunded: i64,
}

impl ChargeRow {
    pub(crate) fn into_charge(self) -> Result<Charge, StoreError> {
        Ok(Charge {
            id: ChargeId::from_uuid(self.id),
            tenant: TenantId::new(self.tenant_id),
            money: money(self.amount, &self.currency)?,
            source: PaymentSource::new(self.source)
                .map_err(|e| StoreError::Corrupt(format!("source: {e}")))?,
            description: self
                .description
                .map(Description::new)
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("description: {e}")))?,
            processor_charge_id: self.processor_charge_id,
            created_at: self.created_at,
            amount_refunded: self.amount_refunded,
        })
    }
}

/// A `refunds` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RefundRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub charge_id: Uuid,
    pub amount: i64,
    pub currency: String,
    pub reason: Option<String>,
    pub processor_refund_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl RefundRow {
    /// A refund is succeeded exactly when it has its processor refund id (the schema's
    /// `succeeded_has_processor_refund`), so the id alone gives the status.
    pub(crate) fn into_refund(self) -> Result<Refund, StoreError> {
        let reason = self
            .reason
            .map(|name| RefundReason::from_name(&name).ok_or_else(|| corrupt("reason", &name)))
            .transpose()?;
        Ok(Refund {
            id: RefundId::from_uuid(self.id),
            tenant: TenantId::new(self.tenant_id),
            charge: ChargeId::from_uuid(self.charge_id),
            money: money(self.amount, &self.currency)?,
            reason,
            status: match self.processor_refund_id {
                Some(processor_refund_id) => RefundStatus::Succeeded {
                    processor_refund_id,
                },
                None => RefundStatus::Pending,
            },
            created_at: self.created_at,
        })
    }
}

/// A `payouts` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PayoutRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub amount: i64,
    pub currency: String,
    pub destination: String,
    pub description: Option<String>,
    pub processor_payout_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl PayoutRow {
    /// A payout is paid exactly when it has its processor payout id (the schema's
    /// `paid_has_processor_payout`), so the id alone gives the status.
    pub(crate) fn into_payout(self) -> Result<Payout, StoreError> {
        Ok(Payout {
            id: PayoutId::from_uuid(self.id),
            tenant: TenantId::new(self.tenant_id),
            money: money(self.amount, &self.currency)?,
            destination: Destination::new(self.destination)
                .map_err(|e| StoreError::Corrupt(format!("destination: {e}")))?,
            description: self
                .description
                .map(Description::new)
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("description: {e}")))?,
            status: match self.processor_payout_id {
                Some(processor_payout_id) => PayoutStatus::Paid {
                    processor_payout_id,
                },
                None => PayoutStatus::Pending,
            },
            created_at: self.created_at,
        })
    }
}

/// A pending refund and the processor's id of the charge it refunds.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ReservedRow {
    #[sqlx(flatten)]
    pub refund: RefundRow,
    pub charge_processor_id: String,
}

/// What a reservation reads of the charge it reserves on.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RefundableRow {
    pub amount: i64,
    pub currency: String,
    pub amount_reserved: i64,
    pub processor_charge_id: String,
}

/// One row of the balance query: account, currency and the signed sum.
pub(crate) fn balance_from_row(
    (account, currency, balance): (String, String, i64),
) -> Result<Balance, StoreError> {
    Ok(Balance {
        account: Account::from_name(&account).ok_or_else(|| corrupt("account", &account))?,
        currency: currency
            .parse()
            .map_err(|_| corrupt("currency", &currency))?,
        balance,
    })
}

/// One row of the funds query: currency, available and pending.
pub(crate) fn funds_from_row(
    (currency, available, pending): (String, i64, i64),
) -> Result<Funds, StoreError> {
    Ok(Funds {
        currency: currency
            .parse()
            .map_err(|_| corrupt("currency", &currency))?,
        available,
        pending,
    })
}

/// A made charge, refund or payout as reconciliation reads the books (`reconciling.rs`).
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
        let resource_id = match kind {
            SettlementKind::Charge => ChargeId::from_uuid(self.id).to_string(),
            SettlementKind::Refund => RefundId::from_uuid(self.id).to_string(),
            SettlementKind::Payout => PayoutId::from_uuid(self.id).to_string(),
        };
        Ok(BooksEntry {
            kind,
            processor_id: self.processor_id,
            tenant: TenantId::new(self.tenant_id),
            resource_id,
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
pub(crate) fn exception_page(
    rows: Vec<ExceptionRow>,
    limit: u32,
) -> Result<ExceptionPage, StoreError> {
    let (exceptions, has_more) = page(rows, limit, ExceptionRow::into_exception)?;
    Ok(ExceptionPage {
        exceptions,
        has_more,
    })
}

/// An `outbox_events` row as the events feed reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    pub id: Uuid,
    pub event_type: String,
    pub payload: String,
    pub created_at: DateTime<Utc>,
}

impl EventRow {
    pub(crate) fn into_event(self) -> Result<StoredEvent, StoreError> {
        Ok(StoredEvent {
            id: EventId::from_uuid(self.id),
            event_type: EventType::from_name(&self.event_type)
                .ok_or_else(|| StoreError::Corrupt(format!("event_type: {:?}", self.event_type)))?,
            payload: serde_json::from_str(&self.payload)
                .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?,
            created_at: self.created_at,
        })
    }
}

/// A page of events, like [`charge_page`].
pub(crate) fn event_page(rows: Vec<EventRow>, limit: u32) -> Result<EventPage, StoreError> {
    let (events, has_more) = page(rows, limit, EventRow::into_event)?;
    Ok(EventPage { events, has_more })
}

/// A page of charges from the rows of a query that asked for one more than `limit`.
pub(crate) fn charge_page(rows: Vec<ChargeRow>, limit: u32) -> Result<ChargePage, StoreError> {
    let (charges, has_more) = page(rows, limit, ChargeRow::into_charge)?;
    Ok(ChargePage { charges, has_more })
}

/// A page of refunds, like [`charge_page`].
pub(crate) fn refund_page(rows: Vec<RefundRow>, limit: u32) -> Result<RefundPage, StoreError> {
    let (refunds, has_more) = page(rows, limit, RefundRow::into_refund)?;
    Ok(RefundPage { refunds, has_more })
}

/// A page of payouts, like [`charge_page`].
pub(crate) fn payout_page(rows: Vec<PayoutRow>, limit: u32) -> Result<PayoutPage, StoreError> {
    let (payouts, has_more) = page(rows, limit, PayoutRow::into_payout)?;
    Ok(PayoutPage { payouts, has_more })
}

/// The first `limit` rows, converted, and whether there were more: a list query asks for one
/// more than `limit`, and that one only says whether another page exists.
fn page<R, T>(
    rows: Vec<R>,
    limit: u32,
    convert: fn(R) -> Result<T, StoreError>,
) -> Result<(Vec<T>, bool), StoreError> {
    let has_more = rows.len() > limit as usize;
    let items = rows
        .into_iter()
        .take(limit as usize)
        .map(convert)
        .collect::<Result<_, _>>()?;
    Ok((items, has_more))
}

/// An `amount` and `currency` pair of columns as the money they hold.
pub(crate) fn money(amount: i64, currency: &str) -> Result<Money, StoreError> {
    let currency: Currency = currency
        .parse()
        .map_err(|_| corrupt("currency", currency))?;
    let amount = Amount::new(amount).map_err(|_| corrupt("amount", amount))?;
    Ok(Money::new(amount, currency))
}

fn corrupt(column: &str, value: impl std::fmt::Debug) -> StoreError {
    StoreError::Corrupt(format!("{column} = {value:?}"))
}
