//! What PostgreSQL's store does its own way: a charge's finish is one statement (and a batch
//! of charges' finishes one statement too), a batch of refunds locks its charges before it
//! posts, the outbox relay locks its rows for the round (`FOR UPDATE SKIP LOCKED`), migrations
//! run without the statement timeout, and the server's synchronous settings are read for
//! `Store::durability`.

use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use payments_idempotency_sql::PgRecords;
use payments_idempotency_sql::postgres::answered;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::posting;
use crate::relay::{EventSink, OutboxEvent, RelayError};

/// The migrations under `migrations/postgres`, embedded in the binary.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// A charge (`$1`..`$8`), its balanced ledger transaction (`$9`, its entries as the JSON array
/// `$10`) and its `payment.completed` event (`$11`..`$13`), as ONE statement: either all of them
/// exist or none does. The ledger's balance trigger and the foreign keys are checked at the end
/// of the statement and at commit as usual.
const INSERT_CHARGE: &str = "
WITH charge AS (
    INSERT INTO charges (id, tenant_id, amount, currency, source, description, status,
                         processor_charge_id, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, 'succeeded', $7, $8)
    RETURNING id, tenant_id
),
ledger AS (
    INSERT INTO ledger_transactions (id, tenant_id, charge_id)
    SELECT $9, charge.tenant_id, charge.id FROM charge
    RETURNING id, tenant_id
),
entries AS (
    INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
    SELECT ledger.id, e.line, ledger.tenant_id, e.entry ->> 'account', e.entry ->> 'currency',
           (e.entry ->> 'amount')::bigint
    FROM ledger, jsonb_array_elements($10) WITH ORDINALITY AS e(entry, line)
)
INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
SELECT $11, charge.tenant_id, $12, charge.id, $13 FROM charge";

/// Writes a charge, its ledger transaction and its event on `connection` (the finish's
/// transaction, or a connection of its own for the bench floor: the same rows either way).
pub(crate) async fn insert_charge(
    connection: &mut PgConnection,
    charge: &Charge,
) -> Result<(), StoreError> {
    let ledger = LedgerTransaction::for_charge(charge);
    let event = PaymentCompleted::for_charge(charge);
    let insert = sqlx::query(INSERT_CHARGE)
        .bind(charge.id.as_uuid())
        .bind(charge.tenant.as_str())
        .bind(charge.money.amount.minor_units())
        .bind(charge.money.currency.code())
        .bind(charge.source.as_str())
        .bind(charge.description.as_ref().map(|d| d.as_str()))
        .bind(charge.processor_charge_id.as_str())
        .bind(charge.created_at)
        .bind(ledger.id())
        .bind(posting::entries(&ledger))
        .bind(event.event_id)
        .bind(PAYMENT_COMPLETED)
        .bind(posting::payload(&event)?);
    answered(insert.execute(connection)).await?;
    Ok(())
}

/// Locks the charges `$1` for update, in the order of their ids: a batch of refunds takes its
/// charges' rows before any of the ledger's balances, and in one order, so that two batches
/// refunding the same charges never hold one each and wait for the other (SQLite has one writer
/// at a time and no row locks).
const LOCK_CHARGES: &str = "
SELECT id FROM charges WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE";

/// Locks `charges` as `LOCK_CHARGES` says, in a batch of refunds' transaction.
pub(crate) async fn lock_charges(
    connection: &mut PgConnection,
    charges: Vec<Uuid>,
) -> Result<(), StoreError> {
    answered(sqlx::query(LOCK_CHARGES).bind(charges).execute(connection)).await?;
    Ok(())
}

/// Several charges with their ledger transactions and events, as `INSERT_CHARGE` writes one,
/// in ONE statement: a batch of finishes. Each array holds one element per charge, in the same
/// order: the charges (`$1`..`$8`), their ledger transactions (`$9`, each one's entries as a
/// JSON array in `$10`) and their events (`$11`, of type `$12`, payloads `$13`).
const INSERT_CHARGES: &str = "
WITH charge AS (
    INSERT INTO charges (id, tenant_id, amount, currency, source, description, status,
                         processor_charge_id, created_at)
    SELECT c.id, c.tenant_id, c.amount, c.currency, c.source, c.description, 'succeeded',
           c.processor_charge_id, c.created_at
    FROM UNNEST($1::uuid[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::timestamptz[])
         AS c(id, tenant_id, amount, currency, source, description, processor_charge_id,
              created_at)
    RETURNING id, tenant_id
),
ledger AS (
    INSERT INTO ledger_transactions (id, tenant_id, charge_id)
    SELECT l.id, charge.tenant_id, charge.id
    FROM charge JOIN UNNEST($1::uuid[], $9::uuid[]) AS l(charge_id, id) ON l.charge_id = charge.id
    RETURNING id, tenant_id
),
entries AS (
    INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
    SELECT ledger.id, e.line, ledger.tenant_id, e.entry ->> 'account', e.entry ->> 'currency',
           (e.entry ->> 'amount')::bigint
    FROM ledger JOIN UNNEST($9::uuid[], $10::jsonb[]) AS l(id, entries) ON l.id = ledger.id,
         jsonb_array_elements(l.entries) WITH ORDINALITY AS e(entry, line)
)
INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
SELECT o.id, charge.tenant_id, $12, charge.id, o.payload
FROM charge
JOIN UNNEST($1::uuid[], $11::uuid[], $13::jsonb[]) AS o(charge_id, id, payload)
  ON o.charge_id = charge.id";

/// Writes several charges, their ledger transactions and their events on `connection` (a
/// batch of finishes' transaction), in one statement.
pub(crate) async fn insert_charges(
    connection: &mut PgConnection,
    charges: &[&Charge],
) -> Result<(), StoreError> {
    let n = charges.len();
    let (mut ids, mut tenants, mut amounts, mut currencies) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut sources, mut descriptions, mut processor_ids, mut created) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut ledgers, mut entries, mut events, mut payloads) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for charge in charges {
        let ledger = LedgerTransaction::for_charge(charge);
        let event = PaymentCompleted::for_charge(charge);
        ids.push(charge.id.as_uuid());
        tenants.push(charge.tenant.as_str());
        amounts.push(charge.money.amount.minor_units());
        currencies.push(charge.money.currency.code());
        sources.push(charge.source.as_str());
        descriptions.push(charge.description.as_ref().map(|d| d.as_str()));
        processor_ids.push(charge.processor_charge_id.as_str());
        created.push(charge.created_at);
        ledgers.push(ledger.id());
        entries.push(posting::entries(&ledger));
        events.push(event.event_id);
        payloads.push(posting::payload(&event)?);
    }
    let insert = sqlx::query(INSERT_CHARGES)
        .bind(ids)
        .bind(tenants)
        .bind(amounts)
        .bind(currencies)
        .bind(sources)
        .bind(descriptions)
        .bind(processor_ids)
        .bind(created)
        .bind(ledgers)
        .bind(entries)
        .bind(events)
        .bind(PAYMENT_COMPLETED)
        .bind(payloads);
    answered(insert.execute(connection)).await?;
    Ok(())
}

/// Up to `$1` unpublished events, oldest first, locked for the relay's round.
const TAKE_UNPUBLISHED: &str = "
SELECT id, event_type, payload::text AS payload FROM outbox_events
WHERE published_at IS NULL
ORDER BY created_at
LIMIT $1
FOR UPDATE SKIP LOCKED";

const MARK_PUBLISHED: &str = "UPDATE outbox_events SET published_at = now() WHERE id = ANY($1)";

/// Publishes up to `batch` unpublished events and marks them published; returns how many.
///
/// The rows are locked with `FOR UPDATE SKIP LOCKED` for the round, so relays on several
/// instances take disjoint rows and never publish one row twice between them. The rows are
/// marked only after the stream accepted them, in the same transaction: if Redis fails they
/// stay unpublished for the next round; if the commit fails after the XADD, the next round
/// publishes them again (at least once, never lost).
pub(crate) async fn relay_outbox(
    records: &PgRecords,
    batch: i64,
    sink: &dyn EventSink,
) -> Result<usize, RelayError> {
    let mut tx = records
        .begin_transaction()
        .await
        .map_err(StoreError::from)?;
    let take = sqlx::query_as(TAKE_UNPUBLISHED).bind(batch);
    let events: Vec<OutboxEvent> = answered(take.fetch_all(&mut *tx))
        .await
        .map_err(StoreError::from)?;
    if events.is_empty() {
        return Ok(0);
    }
    sink.publish(&events).await?;
    let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
    let mark = sqlx::query(MARK_PUBLISHED).bind(ids);
    answered(mark.execute(&mut *tx))
        .await
        .map_err(StoreError::from)?;
    answered(tx.commit()).await.map_err(StoreError::from)?;
    Ok(events.len())
}

/// sqlx takes an advisory lock around the migrations, so instances may start together.
///
/// Migrations may rewrite a large table: they run on a connection of their own without the
/// statement timeout, which is closed afterwards rather than pooled.
pub(crate) async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    let mut connection = pool.acquire().await?;
    connection.close_on_drop();
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *connection)
        .await
        .map_err(|e| sqlx::migrate::MigrateError::Source(Box::new(e)))?;
    MIGRATOR.run_direct(&mut *connection).await
}

/// The server's `synchronous_commit` and `synchronous_standby_names`, read from the settings of
/// a pooled connection, so that a session-level `synchronous_commit` (in the URL's options)
/// counts too.
pub(crate) async fn synchronous_settings(pool: &PgPool) -> Result<(String, String), StoreError> {
    let mut connection = pool.acquire().await?;
    let settings = sqlx::query_as(
        "SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')",
    );
    Ok(answered(settings.fetch_one(&mut *connection)).await?)
}
