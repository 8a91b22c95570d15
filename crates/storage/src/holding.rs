//! What a reservation holds until its record ends, written once for every operation that
//! reserves (refunds on their charge and the tenant's balance, payouts on the balance): the
//! tenant's funds, judged under the tenant's `balance_locks` row. A reservation is made, and
//! released, in the transaction the engine begins over its record, which locks the record: the
//! completer cannot end the generation while it reserves.
//!
//! A tenant's balance is never a stored counter: what it may pay out or refund is read, under
//! the lock, from the ledger's `customer_payments` and the pending rows that hold money. Charges
//! only ever add to it, so they take no lock, and a charge finishing meanwhile can only make
//! the balance larger than the one judged. Every reservation of one tenant and currency takes
//! the lock, so they are judged one after the other; a finish turns a pending row into its
//! ledger transaction in one transaction, so the funds read the same before and after it.

use payments_domain::Currency;

use crate::StoreError;
use crate::dialect::{Dialect, Statement};

/// Locks the tenant's balance in `currency` until the caller's commit and returns what is
/// available in it.
pub(crate) async fn lock_available<DB: Dialect>(
    connection: &mut DB::Connection,
    tenant: &str,
    currency: Currency,
) -> Result<i64, StoreError> {
    // An upsert locks the row on both backends, and creates it the first time.
    let mut lock = Statement::<DB>::new("INSERT INTO balance_locks (tenant_id, currency) VALUES (");
    lock.values([tenant, currency.code()])
        .push(") ON CONFLICT (tenant_id, currency) DO UPDATE SET currency = excluded.currency");
    lock.execute(&mut *connection).await?;
    let funds: Option<(String, i64, i64)> = funds::<DB>(tenant, Some(currency))
        .fetch_optional(connection)
        .await?;
    Ok(funds.map_or(0, |(_, available, _)| available))
}

/// The tenant's funds per currency (in `currency` only, when given) as rows of currency,
/// available and pending, in one statement, so that they are read from one snapshot.
pub(crate) fn funds<'a, DB: Dialect>(
    tenant: &'a str,
    currency: Option<Currency>,
) -> Statement<'a, DB> {
    let mut sql = Statement::new(
        "SELECT currency, CAST(sum(available) AS BIGINT), CAST(sum(pending) AS BIGINT) FROM (",
    );
    let held = [
        "SELECT currency, -amount AS available, 0 AS pending FROM ledger_entries
         WHERE account = 'customer_payments' AND tenant_id = ",
        " UNION ALL SELECT currency, -amount, 0 FROM refunds
         WHERE status = 'pending' AND tenant_id = ",
        " UNION ALL SELECT currency, -amount, amount FROM payouts
         WHERE status = 'pending' AND tenant_id = ",
    ];
    for part in held {
        sql.push(part).value(tenant);
        if let Some(currency) = currency {
            sql.push(" AND currency = ").value(currency.code());
        }
    }
    sql.push(") held GROUP BY currency ORDER BY currency");
    sql
}
