//! The rows every effect posts besides its own, written once for both backends: its balanced
//! ledger transaction and its outbox event, on the caller's transaction (PostgreSQL's charge
//! finish writes the same rows inside its one statement, in `postgres/charges.rs`).

use payments_domain::LedgerTransaction;
use serde::Serialize;
use uuid::Uuid;

use crate::StoreError;
use crate::dialect::{Dialect, Statement};

/// What a ledger transaction posts: a charge, a refund of a charge, or a payout.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Posted {
    Charge(Uuid),
    Refund { charge: Uuid, refund: Uuid },
    Payout(Uuid),
}

impl Posted {
    /// The transaction's `charge_id`, `refund_id` and `payout_id`.
    fn columns(self) -> [Option<Uuid>; 3] {
        match self {
            Self::Charge(charge) => [Some(charge), None, None],
            Self::Refund { charge, refund } => [Some(charge), Some(refund), None],
            Self::Payout(payout) => [None, None, Some(payout)],
        }
    }
}

/// Inserts `ledger`'s entries and its transaction row, in the order the backend seals a
/// transaction in ([`Dialect::SEALS_LEDGER_LAST`]).
pub(crate) async fn post_ledger<DB: Dialect>(
    connection: &mut DB::Connection,
    ledger: &LedgerTransaction,
    tenant: &str,
    posted: Posted,
) -> Result<(), StoreError> {
    let mut entries = Statement::<DB>::new(
        "INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
         VALUES ",
    );
    for (line, e) in (1_i16..).zip(ledger.entries()) {
        if line > 1 {
            entries.push(", ");
        }
        entries.push("(").value(ledger.id()).push(", ").value(line);
        entries
            .push(", ")
            .value(tenant)
            .push(", ")
            .value(e.account.name());
        entries
            .push(", ")
            .value(e.currency.code())
            .push(", ")
            .value(e.amount);
        entries.push(")");
    }
    let mut transaction = Statement::<DB>::new(
        "INSERT INTO ledger_transactions
             (id, charge_id, refund_id, payout_id, tenant_id, created_at)
         VALUES (",
    );
    let [charge, refund, payout] = posted.columns();
    transaction
        .values([Some(ledger.id()), charge, refund, payout])
        .push(", ")
        .value(tenant)
        .push(", ")
        .push(DB::NOW)
        .push(")");
    if DB::SEALS_LEDGER_LAST {
        entries.execute(&mut *connection).await?;
        transaction.execute(connection).await?;
    } else {
        transaction.execute(&mut *connection).await?;
        entries.execute(connection).await?;
    }
    Ok(())
}

/// Inserts the outbox row of `event`, of type `event_type`, about `aggregate`.
pub(crate) async fn insert_event<DB: Dialect>(
    connection: &mut DB::Connection,
    event: &impl Serialize,
    id: Uuid,
    aggregate: Uuid,
    tenant: &str,
    event_type: &str,
) -> Result<(), StoreError> {
    let payload = serde_json::to_value(event)
        .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?;
    let mut outbox = Statement::<DB>::new(
        "INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
         VALUES (",
    );
    outbox
        .values([id, aggregate])
        .push(", ")
        .values([tenant, event_type])
        .push(", ")
        .value(payload)
        .push(", ")
        .push(DB::NOW)
        .push(")");
    outbox.execute(connection).await?;
    Ok(())
}
