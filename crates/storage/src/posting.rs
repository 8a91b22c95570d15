//! The values every effect's finish binds besides its own: its ledger transaction's entries and
//! its outbox event's payload, as JSON, made once for both backends. Each effect writes them in
//! its own statement (a charge in `postgres.rs` and `sqlite.rs`, a refund in `refunds.rs`, a
//! payout in `payouts.rs`), which reads the entries from the array one row each.

use payments_domain::LedgerTransaction;
use serde::Serialize;

use crate::StoreError;

/// `ledger`'s entries as a JSON array of `{"account", "currency", "amount"}`, in line order:
/// line N is the array's N-th element (PostgreSQL's `WITH ORDINALITY`, SQLite's
/// `json_each(..).key + 1`).
pub(crate) fn entries(ledger: &LedgerTransaction) -> serde_json::Value {
    ledger
        .entries()
        .iter()
        .map(|e| {
            serde_json::json!({
                "account": e.account.name(),
                "currency": e.currency.code(),
                "amount": e.amount,
            })
        })
        .collect()
}

/// An outbox event's payload.
pub(crate) fn payload(event: &impl Serialize) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(event).map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))
}
