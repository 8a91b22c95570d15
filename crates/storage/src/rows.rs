//! Database rows and their conversion into protocol and domain types.

use chrono::{DateTime, Utc};
use payments_domain::{
    Amount, Charge, ChargeId, Currency, Description, Money, PaymentSource, TenantId,
};
use payments_idempotency::{
    Attempt, Fingerprint, IdempotencyKey, IdempotencyRecord, Scope, StoredResponse,
};
use uuid::Uuid;

use crate::StoreError;

/// An `idempotency_records` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RecordRow {
    pub tenant_id: String,
    pub operation: String,
    pub idempotency_key: String,
    pub fingerprint: Vec<u8>,
    pub state: String,
    pub recovery_point: String,
    pub locked_until: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub processor_key: String,
    pub processor_charge_id: Option<String>,
    pub response_status: Option<i16>,
    pub response_headers: Option<serde_json::Value>,
    pub response_body: Option<Vec<u8>>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl RecordRow {
    pub fn into_record(self) -> Result<IdempotencyRecord, StoreError> {
        let response = match (self.response_status, self.response_body) {
            (Some(status), Some(body)) => Some(StoredResponse {
                status: u16::try_from(status).map_err(|_| corrupt("response_status", status))?,
                headers: headers_from_json(self.response_headers)?,
                body,
            }),
            _ => None,
        };
        Ok(IdempotencyRecord {
            scope: Scope {
                tenant: self.tenant_id,
                operation: self.operation,
            },
            key: IdempotencyKey::parse(&self.idempotency_key)
                .map_err(|e| StoreError::Corrupt(format!("idempotency_key: {e}")))?,
            fingerprint: Fingerprint::from_bytes(&self.fingerprint)
                .map_err(|e| StoreError::Corrupt(format!("fingerprint: {e}")))?,
            state: self
                .state
                .parse()
                .map_err(|_| corrupt("state", &self.state))?,
            recovery_point: self
                .recovery_point
                .parse()
                .map_err(|_| corrupt("recovery_point", &self.recovery_point))?,
            locked_until: self.locked_until,
            attempts: Attempt(self.attempts),
            processor_key: self.processor_key,
            processor_charge_id: self.processor_charge_id,
            response,
            created_at: self.created_at,
            expires_at: self.expires_at,
        })
    }
}

/// Headers are stored as a JSON array of `[name, value]` pairs, keeping their order.
pub(crate) fn headers_to_json(headers: &[(String, String)]) -> serde_json::Value {
    serde_json::Value::Array(
        headers
            .iter()
            .map(|(n, v)| serde_json::json!([n, v]))
            .collect(),
    )
}

fn headers_from_json(
    value: Option<serde_json::Value>,
) -> Result<Vec<(String, String)>, StoreError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    serde_json::from_value(value).map_err(|e| StoreError::Corrupt(format!("response_headers: {e}")))
}

/// A `charges` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ChargeRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub amount: i64,
    pub currency: String,
    pub source: String,
    pub description: Option<String>,
    pub processor_charge_id: String,
    pub created_at: DateTime<Utc>,
}

impl ChargeRow {
    pub fn into_charge(self) -> Result<Charge, StoreError> {
        let currency: Currency = self
            .currency
            .parse()
            .map_err(|_| corrupt("currency", &self.currency))?;
        Ok(Charge {
            id: ChargeId::from_uuid(self.id),
            tenant: TenantId::new(self.tenant_id),
            money: Money::new(
                Amount::new(self.amount).map_err(|_| corrupt("amount", self.amount))?,
                currency,
            ),
            source: PaymentSource::new(self.source)
                .map_err(|e| StoreError::Corrupt(format!("source: {e}")))?,
            description: self
                .description
                .map(Description::new)
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("description: {e}")))?,
            processor_charge_id: self.processor_charge_id,
            created_at: self.created_at,
        })
    }
}

/// A response status as the `smallint` column stores it.
pub(crate) fn stored_status(response: &StoredResponse) -> Result<i16, StoreError> {
    i16::try_from(response.status)
        .map_err(|_| StoreError::Corrupt(format!("status {} out of range", response.status)))
}

fn corrupt(column: &str, value: impl std::fmt::Debug) -> StoreError {
    StoreError::Corrupt(format!("{column} = {value:?}"))
}
