//! What a reservation holds until its record ends, written once for every operation that
//! reserves on the tenant's balance: the tenant's funds, judged under the tenant's
//! `balance_locks` row. A reservation is made, and
//! released, in the transaction the engine begins over its record, which locks the record: the
//! completer cannot end the generation while it reserves.
//!
//! A tenant's balance is never a counter the code keeps: what it may pay out or refund is
//! read, under the lock, from the `funds` view: the ledger's `customer_payments` balance (the
//! parts the database adds each entry to as it is written, `ledger_balances`, so the read
//! costs the same whatever the tenant's history) and the pending rows that hold money. Charges
//! only ever add to it, so they take no lock, and a charge finishing meanwhile can only make
//! the balance larger than the one judged. Every reservation of one tenant and currency takes
//! the lock, so they are judged one after the other; a finish turns a pending row into its
//! ledger transaction in one transaction, so the funds read the same before and after it.

use payments_domain::Currency;
use payments_idempotency_sql::Connection;

use crate::StoreError;
use crate::sql::Sql;

/// Locks the tenant's balance in a currency until the commit, creating its row the first
/// time: an upsert locks the row on both backends.
const LOCK_BALANCE: &str = "
INSERT INTO balance_locks (tenant_id, currency) VALUES ($1, $2)
ON CONFLICT (tenant_id, currency) DO UPDATE SET currency = excluded.currency";

/// The tenant's (`$1`) funds per currency (in `$2` only, unless it is `NULL`), as rows of
/// currency, available, pending and authorized, in one statement, so that they are read from
/// one snapshot. The sums are cast back to bigints (PostgreSQL sums bigints as numeric).
pub(crate) const FUNDS: &str = "
SELECT currency, CAST(sum(available) AS BIGINT), CAST(sum(pending) AS BIGINT),
       CAST(sum(authorized) AS BIGINT)
FROM funds
WHERE tenant_id = $1 AND ($2 IS NULL OR currency = $2)
GROUP BY currency ORDER BY currency";

/// Locks the tenant's balance in `currency` until the caller's commit and returns what is
/// available in it.
pub(crate) async fn lock_available(
    connection: &mut Connection<'_>,
    tenant: &str,
    currency: Currency,
) -> Result<i64, StoreError> {
    Sql::new(LOCK_BALANCE)
        .bind(tenant)
        .bind(currency.code())
        .execute(connection)
        .await?;
    let funds: Option<(String, i64, i64, i64)> = Sql::new(FUNDS)
        .bind(tenant)
        .bind(Some(currency.code()))
        .fetch_optional(connection)
        .await?;
    Ok(funds.map_or(0, |(_, available, _, _)| available))
}
