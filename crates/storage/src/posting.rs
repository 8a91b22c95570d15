//! The rows every effect posts besides its own, written once for both backends: its balanced
//! ledger transaction and its outbox event, on the caller's transaction (a charge's finish
//! writes the same rows in its own statement on PostgreSQL, and its own script on SQLite, in
//! `postgres.rs` and `sqlite.rs`).

use payments_domain::LedgerTransaction;
use serde::Serialize;
use uuid::Uuid;

use payments_idempotency_sql::Connection;

use crate::StoreError;
use crate::sql::{Each, Sql};

const INSERT_LEDGER_ENTRY: &str = "
INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
VALUES ($1, $2, $3, $4, $5, $6)";

/// Inserts `ledger`'s entries and `transaction`, its `ledger_transactions` row, in the order
/// the backend seals a transaction in: on PostgreSQL the row goes first (its entries' foreign
/// key is immediate, the balance is checked at commit); on SQLite it goes last, and inserting
/// it seals the entries (the schema's trigger checks they balance). The row names what it
/// posts, in that effect's own column, so each effect's storage writes its statement.
pub(crate) async fn post_ledger(
    connection: &mut Connection<'_>,
    ledger: &LedgerTransaction,
    tenant: &str,
    transaction: Sql<'_>,
) -> Result<(), StoreError> {
    if let Connection::Sqlite(_) = connection {
        insert_entries(connection, ledger, tenant).await?;
        transaction.execute(connection).await?;
    } else {
        transaction.execute(connection).await?;
        insert_entries(connection, ledger, tenant).await?;
    }
    Ok(())
}

async fn insert_entries(
    connection: &mut Connection<'_>,
    ledger: &LedgerTransaction,
    tenant: &str,
) -> Result<(), StoreError> {
    for (line, e) in (1_i16..).zip(ledger.entries()) {
        Sql::new(INSERT_LEDGER_ENTRY)
            .bind(ledger.id())
            .bind(line)
            .bind(tenant)
            .bind(e.account.name())
            .bind(e.currency.code())
            .bind(e.amount)
            .execute(connection)
            .await?;
    }
    Ok(())
}

const INSERT_EVENT: Each = Each {
    postgres: "
INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($1, $2, $3, $4, $5, now())",
    sqlite: "
INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($1, $2, $3, $4, $5, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
};

/// Inserts the outbox row of `event`, of type `event_type`, about `aggregate`.
pub(crate) async fn insert_event(
    connection: &mut Connection<'_>,
    event: &impl Serialize,
    id: Uuid,
    aggregate: Uuid,
    tenant: &str,
    event_type: &str,
) -> Result<(), StoreError> {
    let payload = serde_json::to_value(event)
        .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?;
    Sql::new(INSERT_EVENT)
        .bind(id)
        .bind(aggregate)
        .bind(tenant)
        .bind(event_type)
        .bind(payload)
        .execute(connection)
        .await?;
    Ok(())
}
