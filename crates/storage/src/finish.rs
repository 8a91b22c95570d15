//! Fenced writes of an owning attempt: recovery points and the finishing transaction.

use payments_domain::{Charge, LedgerTransaction, PAYMENT_COMPLETED, PaymentCompleted};
use payments_idempotency::{Attempt, IdempotencyKey, Scope, StoredResponse};
use sqlx::PgConnection;

use crate::rows::headers_to_json;
use crate::{PgStore, StoreError};

/// Whether a fenced write took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The record still belonged to this attempt and was written.
    Written,
    /// Another attempt took the record over: nothing was written, and this attempt must answer
    /// from the record as it now is.
    Fenced,
}

impl Finish {
    fn from_rows(rows: u64) -> Self {
        if rows == 1 {
            Self::Written
        } else {
            Self::Fenced
        }
    }
}

// Every statement below carries this condition: the record is still pending and still holds
// the attempt number this attempt claimed with.
const FENCE: &str = "tenant_id = $1 AND operation = $2 AND idempotency_key = $3
                     AND attempts = $4 AND state = 'pending'";

impl PgStore {
    /// Records that the processor confirmed the charge, so that a takeover resumes from here.
    pub async fn record_charged(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        attempt: Attempt,
        processor_charge_id: &str,
    ) -> Result<Finish, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET recovery_point = 'charged', processor_charge_id = $5, updated_at = now()
             WHERE {FENCE}"
        );
        let done = sqlx::query(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(attempt.0)
            .bind(processor_charge_id)
            .execute(&self.pool)
            .await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Marks a transient failure: the lock is released and the next retry executes again
    /// (with the same processor key, so a charge the processor did make is found, not repeated).
    pub async fn mark_failed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        attempt: Attempt,
    ) -> Result<Finish, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET state = 'failed', locked_until = NULL, updated_at = now()
             WHERE {FENCE}"
        );
        let done = sqlx::query(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(attempt.0)
            .execute(&self.pool)
            .await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Gives up the lock after an unknown outcome (the processor timed out or was unreachable):
    /// the record stays pending and becomes stale at once, so the next retry resumes it and, if
    /// nobody retries, the completer asks the processor whether the charge happened. Marking it
    /// failed instead would leave a charge the processor did make unrecorded.
    pub async fn release_lock(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        attempt: Attempt,
    ) -> Result<Finish, StoreError> {
        let sql = format!(
            "UPDATE idempotency_records
             SET locked_until = now(), updated_at = now()
             WHERE {FENCE}"
        );
        let done = sqlx::query(&sql)
            .bind(&scope.tenant)
            .bind(&scope.operation)
            .bind(key.as_str())
            .bind(attempt.0)
            .execute(&self.pool)
            .await?;
        Ok(Finish::from_rows(done.rows_affected()))
    }

    /// Completes the record with a response that created nothing (a decline).
    pub async fn finish_without_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &StoredResponse,
    ) -> Result<Finish, StoreError> {
        let mut conn = self.pool.acquire().await?;
        complete_record(&mut conn, scope, key, attempt, response).await
    }

    /// Writes the charge, its ledger transaction, its `payment.completed` outbox event and the
    /// completed record in ONE transaction: either all of them exist or none does.
    ///
    /// The record is updated first, so the row lock it takes orders this transaction against
    /// any other attempt's; if the fence fails, nothing else is written.
    pub async fn finish_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        attempt: Attempt,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Finish, StoreError> {
        let ledger = LedgerTransaction::for_charge(charge);
        let event = PaymentCompleted::for_charge(charge);
        let mut tx = self.pool.begin().await?;
        if complete_record(&mut tx, scope, key, attempt, response).await? == Finish::Fenced {
            tx.rollback().await?;
            return Ok(Finish::Fenced);
        }
        insert_charge(&mut tx, charge).await?;
        insert_ledger_transaction(&mut tx, charge, &ledger).await?;
        insert_outbox_event(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(Finish::Written)
    }
}

async fn complete_record(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &IdempotencyKey,
    attempt: Attempt,
    response: &StoredResponse,
) -> Result<Finish, StoreError> {
    let sql = format!(
        "UPDATE idempotency_records
         SET state = 'completed', recovery_point = 'finished', locked_until = NULL,
             response_status = $5, response_headers = $6, response_body = $7, updated_at = now()
         WHERE {FENCE}"
    );
    let status = i16::try_from(response.status)
        .map_err(|_| StoreError::Corrupt(format!("status {} out of range", response.status)))?;
    let done = sqlx::query(&sql)
        .bind(&scope.tenant)
        .bind(&scope.operation)
        .bind(key.as_str())
        .bind(attempt.0)
        .bind(status)
        .bind(headers_to_json(&response.headers))
        .bind(&response.body)
        .execute(conn)
        .await?;
    Ok(Finish::from_rows(done.rows_affected()))
}

async fn insert_charge(conn: &mut PgConnection, charge: &Charge) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO charges
             (id, tenant_id, amount, currency, source, description, status, processor_charge_id, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, 'succeeded', $7, $8)",
    )
    .bind(charge.id.as_uuid())
    .bind(charge.tenant.as_str())
    .bind(charge.money.amount.minor_units())
    .bind(charge.money.currency.code())
    .bind(charge.source.as_str())
    .bind(charge.description.as_ref().map(|d| d.as_str()))
    .bind(&charge.processor_charge_id)
    .bind(charge.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

async fn insert_ledger_transaction(
    conn: &mut PgConnection,
    charge: &Charge,
    ledger: &LedgerTransaction,
) -> Result<(), StoreError> {
    let entries = ledger.entries();
    let lines: Vec<i16> = (1..).take(entries.len()).collect();
    let accounts: Vec<&str> = entries.iter().map(|e| e.account.name()).collect();
    let currencies: Vec<&str> = entries.iter().map(|e| e.currency.code()).collect();
    let amounts: Vec<i64> = entries.iter().map(|e| e.amount).collect();
    // The transaction row and all its entries in one statement.
    sqlx::query(
        "WITH tx AS (
             INSERT INTO ledger_transactions (id, tenant_id, charge_id) VALUES ($1, $2, $3)
             RETURNING id, tenant_id
         )
         INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
         SELECT tx.id, e.line, tx.tenant_id, e.account, e.currency, e.amount
         FROM tx, UNNEST($4::smallint[], $5::text[], $6::text[], $7::bigint[])
              AS e(line, account, currency, amount)",
    )
    .bind(ledger.id())
    .bind(charge.tenant.as_str())
    .bind(charge.id.as_uuid())
    .bind(&lines)
    .bind(&accounts)
    .bind(&currencies)
    .bind(&amounts)
    .execute(conn)
    .await?;
    Ok(())
}

async fn insert_outbox_event(
    conn: &mut PgConnection,
    event: &PaymentCompleted,
) -> Result<(), StoreError> {
    let payload = serde_json::to_value(event)
        .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?;
    sqlx::query(
        "INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(event.event_id)
    .bind(event.tenant.as_str())
    .bind(PAYMENT_COMPLETED)
    .bind(event.charge_id.as_uuid())
    .bind(payload)
    .execute(conn)
    .await?;
    Ok(())
}

impl PgStore {
    /// Writes a charge, its ledger transaction and its event in one transaction, with no
    /// idempotency record at all. Not part of the service: it is the floor the charge flow is
    /// measured against in the benchmarks (the same writes, none of the protection).
    pub async fn write_charge_unguarded(&self, charge: &Charge) -> Result<(), StoreError> {
        let ledger = LedgerTransaction::for_charge(charge);
        let event = PaymentCompleted::for_charge(charge);
        let mut tx = self.pool.begin().await?;
        insert_charge(&mut tx, charge).await?;
        insert_ledger_transaction(&mut tx, charge, &ledger).await?;
        insert_outbox_event(&mut tx, &event).await?;
        tx.commit().await?;
        Ok(())
    }
}
