//! What SQLite's store does its own way: a charge's finish is one script of a statement per
//! row, the outbox relay leases its rows instead of locking them, and migrations queue at the
//! write gate.
//!
//! SQLite has one writer at a time and no row locks, so the guarantees are kept differently
//! from PostgreSQL, with the same outcomes:
//! - every read-then-write step runs in a `BEGIN IMMEDIATE` transaction, which takes the
//!   database's write lock before its first read: two claims of one key cannot both see it
//!   free or stale, whether they come from one process or several;
//! - inside one process, writers also queue on an async mutex first, so they wait their turn
//!   in order instead of spinning in SQLite's busy handler;
//! - the clock is SQLite's (`strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`), so lock expiry is judged
//!   the same way by every process on the file.

use std::time::Duration;

use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use payments_idempotency_sql::{Connection, SqliteRecords};
use sqlx::SqliteConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::posting;
use crate::relay::{EventSink, OutboxEvent, RelayError};
use crate::sql::Sql;

/// The migrations under `migrations/sqlite`, embedded in the binary.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// A charge (`$1`..`$8`), its balanced ledger transaction (`$9`, its entries as the JSON array
/// `$10`) and its `payment.completed` event (`$11`..`$13`): PostgreSQL's one statement as
/// SQLite's four, run as one script, in one round trip to the connection's thread. The entries
/// go before their transaction's row, whose insert seals them (the schema's trigger checks
/// that they balance). The caller's transaction makes the four one: all of them or none.
const INSERT_CHARGE: &str = "
INSERT INTO charges
    (id, tenant_id, amount, currency, source, description, status, processor_charge_id,
     created_at)
VALUES ($1, $2, $3, $4, $5, $6, 'succeeded', $7, $8);

INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
SELECT $9, e.key + 1, $2, e.value ->> 'account', e.value ->> 'currency', e.value ->> 'amount'
FROM json_each($10) AS e;

INSERT INTO ledger_transactions (id, charge_id, tenant_id, created_at)
VALUES ($9, $1, $2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));

INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload, created_at)
VALUES ($11, $1, $2, $12, $13, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))";

/// Inserts a charge, its ledger transaction and its `payment.completed` event on
/// `connection`, which must be inside the caller's transaction.
pub(crate) async fn insert_charge(
    connection: &mut SqliteConnection,
    charge: &Charge,
) -> Result<(), StoreError> {
    let ledger = LedgerTransaction::for_charge(charge);
    let event = PaymentCompleted::for_charge(charge);
    Sql::new(INSERT_CHARGE)
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
        .bind(posting::payload(&event)?)
        .execute(&mut Connection::Sqlite(connection))
        .await?;
    Ok(())
}

/// How long a relay may hold events it is publishing before another relay may take them.
const RELAY_LEASE: Duration = Duration::from_secs(10);

/// Leases up to `$2` unpublished events, unleased or with a lease run out, for `$1` seconds.
const LEASE_UNPUBLISHED: &str = "
UPDATE outbox_events
SET relay_lease_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || $1 || ' seconds')
WHERE rowid IN (
    SELECT rowid FROM outbox_events
    WHERE published_at IS NULL
      AND (relay_lease_until IS NULL
           OR relay_lease_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
    ORDER BY created_at
    LIMIT $2)
RETURNING id, event_type, payload, created_at";

const MARK_PUBLISHED: &str = "
UPDATE outbox_events
SET published_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), relay_lease_until = NULL
WHERE id = $1";

const GIVE_BACK_LEASE: &str = "UPDATE outbox_events SET relay_lease_until = NULL WHERE id = $1";

/// Leases a batch, publishes it, then marks it published. The write lock is not held across
/// the publish (a slow Redis must not stop every writer): the lease keeps relays in other
/// processes off these rows meanwhile, as `SKIP LOCKED` does on PostgreSQL. If the publish
/// fails the lease is given back at once; if this process dies, it runs out.
pub(crate) async fn relay_outbox(
    records: &SqliteRecords,
    batch: i64,
    sink: &dyn EventSink,
) -> Result<usize, RelayError> {
    let mut leased: Vec<(Uuid, String, String, String)> = {
        // Scoped: the write gate must be released before the publish and the settle.
        let mut write = records.begin_write().await.map_err(StoreError::from)?;
        let lease = Sql::new(LEASE_UNPUBLISHED)
            .bind(RELAY_LEASE.as_secs_f64())
            .bind(batch);
        let rows = lease
            .fetch_all(&mut Connection::Sqlite(&mut write))
            .await
            .map_err(StoreError::from)?;
        write.commit().await.map_err(StoreError::from)?;
        rows
    };
    if leased.is_empty() {
        return Ok(0);
    }
    // RETURNING has no order: publish in the order the events were written.
    leased.sort_by(|a, b| a.3.cmp(&b.3));
    let events: Vec<OutboxEvent> = leased
        .into_iter()
        .map(|(id, event_type, payload, _)| OutboxEvent {
            id,
            event_type,
            payload,
        })
        .collect();
    let published = sink.publish(&events).await;
    let settle = if published.is_ok() {
        MARK_PUBLISHED
    } else {
        GIVE_BACK_LEASE
    };
    let mut write = records.begin_write().await.map_err(StoreError::from)?;
    for event in &events {
        Sql::new(settle)
            .bind(event.id)
            .execute(&mut Connection::Sqlite(&mut write))
            .await
            .map_err(StoreError::from)?;
    }
    write.commit().await.map_err(StoreError::from)?;
    published?;
    Ok(events.len())
}

/// Migrations write: several processes starting on one file take turns.
pub(crate) async fn migrate(records: &SqliteRecords) -> Result<(), sqlx::migrate::MigrateError> {
    let _gate = records.lock_writes().await;
    MIGRATOR.run(records.pool()).await
}
