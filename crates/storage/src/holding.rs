//! What a reservation holds until its record ends, written once for every operation that
//! reserves (refunds on their charge and the tenant's balance, payouts on the balance): the
//! fenced start of a reservation, the tenant's funds, judged under the tenant's
//! `balance_locks` row, and the fenced ends of a record that release what its generation
//! reserved, in the transaction that ends it.
//!
//! A tenant's balance is never a stored counter: what it may pay out or refund is read, under
//! the lock, from the ledger's `customer_payments` and the pending rows that hold money. Charges
//! only ever add to it, so they take no lock, and a charge finishing meanwhile can only make
//! the balance larger than the one judged. Every reservation of one tenant and currency takes
//! the lock, so they are judged one after the other; a finish turns a pending row into its
//! ledger transaction in one transaction, so the funds read the same before and after it.

use std::future::Future;

use payments_domain::Currency;
use uuid::Uuid;

use crate::StoreError;
use crate::dialect::{Dialect, Statement};
use crate::fenced;
use crate::model::{Completion, Fence, Finish, Owner, Unmade};
use crate::sql_store::{SqlStore, complete_on};

/// What one kind of reservation holds: a pending row with the id of its record's generation,
/// and whatever else it claimed with it.
pub(crate) trait Hold {
    /// Releases what the generation `id` reserved, on the caller's transaction. Nothing to do
    /// when it reserved nothing, or its reservation has become its effect's rows.
    fn release<DB: Dialect>(
        connection: &mut DB::Connection,
        id: Uuid,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Begins the transaction of a reservation with the fenced touch of its record, which locks
/// the record until the commit: the completer cannot end this generation while it reserves.
/// `None` when another attempt or generation owns the record.
pub(crate) async fn begin_reserving<'s, S: SqlStore>(
    store: &'s S,
    owner: Owner<'_>,
) -> Result<Option<S::Write<'s>>, StoreError> {
    let mut write = store.begin_write().await?;
    let touched = fenced::touch::<S::Db>(owner).execute(&mut write).await?;
    Ok((Finish::from_rows(touched) == Finish::Written).then_some(write))
}

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

/// Ends the record with `ending` (a fenced statement `RETURNING expires_at`) and releases what
/// the generation reserved, in one transaction.
async fn end_releasing<S: SqlStore, H: Hold>(
    store: &S,
    ending: Statement<'_, S::Db>,
    fence: Fence,
) -> Result<Completion, StoreError> {
    let mut write = store.begin_write().await?;
    let completion = complete_on::<S::Db>(&mut write, ending).await?;
    if completion == Completion::Fenced {
        return Ok(completion);
    }
    H::release::<S::Db>(&mut write, fence.resource_id).await?;
    S::commit(write).await?;
    Ok(completion)
}

/// Ends the record without an effect (with its final answer, or failed after the processor
/// tombstoned its key), releasing what the generation reserved: nothing was or can be made
/// under it.
pub(crate) async fn end<S: SqlStore, H: Hold>(
    store: &S,
    owner: Owner<'_>,
    end: Unmade<'_>,
) -> Result<Completion, StoreError> {
    let ttl = store.policy().ttl;
    let ending = match end {
        Unmade::Answered(response) => {
            fenced::complete_without_effect::<S::Db>(owner, response, ttl)?
        }
        Unmade::Tombstoned => fenced::fail::<S::Db>(owner, ttl),
    };
    end_releasing::<S, H>(store, ending, owner.fence).await
}
