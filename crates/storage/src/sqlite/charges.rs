//! The inserts one charge's finish makes on SQLite, one statement each on the caller's
//! transaction (PostgreSQL makes them in one statement, in `postgres/charges.rs`).

use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use sqlx::{Sqlite, SqliteConnection};

use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::posting::{self, Posted};

/// Inserts a charge, its ledger transaction and its `payment.completed` event on
/// `connection`, which must be inside the caller's transaction. The entries go in before the
/// transaction row: inserting that row seals the transaction, and the schema's trigger checks
/// it balances.
pub(super) async fn insert_charge_writes(
    connection: &mut SqliteConnection,
    charge: &Charge,
) -> Result<(), StoreError> {
    let tenant = charge.tenant.as_str();
    let mut insert = Statement::<Sqlite>::new(
        "INSERT INTO charges
             (id, tenant_id, currency, source, description, processor_charge_id, amount, status,
              created_at)
         VALUES (",
    );
    insert
        .value(charge.id.as_uuid())
        .push(", ")
        .values([tenant, charge.money.currency.code(), charge.source.as_str()])
        .push(", ")
        .values([
            charge.description.as_ref().map(|d| d.as_str()),
            Some(charge.processor_charge_id.as_str()),
        ])
        .push(", ")
        .value(charge.money.amount.minor_units())
        .push(", 'succeeded', ");
    Sqlite::push_time(&mut insert, charge.created_at);
    insert.push(")");
    insert.execute(&mut *connection).await?;
    let posted = Posted::Charge(charge.id.as_uuid());
    let ledger = LedgerTransaction::for_charge(charge);
    posting::post_ledger::<Sqlite>(&mut *connection, &ledger, tenant, posted).await?;
    let event = PaymentCompleted::for_charge(charge);
    let (id, aggregate) = (event.event_id, charge.id.as_uuid());
    posting::insert_event::<Sqlite>(connection, &event, id, aggregate, tenant, PAYMENT_COMPLETED)
        .await
}
