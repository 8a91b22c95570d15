//! The values every effect's finish binds besides its own: its ledger transaction's entries and
//! its outbox event's payload, as JSON, made once for both backends. Each effect writes them in
//! its own statement (a charge in `postgres.rs` and `sqlite.rs`, a refund in `refunds.rs`, a
//! payout in `payouts.rs`), which reads the entries from the array one row each; and the order
//! in which a transaction of several postings writes them.

use payments_domain::{Currency, LedgerTransaction, TenantId};
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

/// `postings` in the order a transaction of several writes them: by tenant, then currency (as
/// bytes, the order in which the balances' trigger takes a statement's rows), and in the given
/// order within each, so that two postings to one balance (two refunds of one charge) keep it.
/// Every transaction then takes the ledger's balances in one order, and none waits in a circle
/// (storage.md's "Lock order").
pub(crate) fn in_balance_order<'a, T>(
    postings: &[&'a T],
    balance: impl Fn(&T) -> (&TenantId, Currency),
) -> Vec<&'a T> {
    let mut ordered = postings.to_vec();
    ordered.sort_by(|a, b| {
        let ((a_tenant, a_currency), (b_tenant, b_currency)) = (balance(a), balance(b));
        (a_tenant.as_str(), a_currency.code()).cmp(&(b_tenant.as_str(), b_currency.code()))
    });
    ordered
}
