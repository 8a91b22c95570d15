//! An `idempotency_records` row as either backend reads it, and its conversion into the
//! engine's types: nothing above this crate sees a database type.

use chrono::{DateTime, Utc};
use payments_idempotency::engine::{Abandoned, Claimed};
use payments_idempotency::{
    Attempt, Fingerprint, IdempotencyKey, IdempotencyRecord, RecoveryPoint, SchemaVersion, Scope,
    StoredResponse,
};
use uuid::Uuid;

use crate::error::{Error, corrupt};

/// A record and the database's clock, read in one statement: every instance judges lock
/// expiry by the same clock, never its own.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RecordWithClock {
    #[sqlx(flatten)]
    row: RecordRow,
    db_now: DateTime<Utc>,
}

impl RecordWithClock {
    pub(crate) fn into_record(self) -> Result<(IdempotencyRecord, DateTime<Utc>), Error> {
        Ok((self.row.into_record()?, self.db_now))
    }
}

#[derive(Debug, sqlx::FromRow)]
struct RecordRow {
    tenant_id: String,
    operation: String,
    idempotency_key: String,
    fingerprint: Vec<u8>,
    request_version: i32,
    state: String,
    resource_id: Uuid,
    recovery_point: String,
    locked_until: Option<DateTime<Utc>>,
    attempts: i32,
    processor_key: String,
    effect_id: Option<String>,
    response_status: Option<i16>,
    response_headers: Option<serde_json::Value>,
    response_body: Option<Vec<u8>>,
    response_schema_version: Option<i32>,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

impl RecordRow {
    fn into_record(self) -> Result<IdempotencyRecord, Error> {
        let response = match (self.response_status, self.response_body) {
            (Some(status), Some(body)) => Some(StoredResponse {
                schema_version: schema_version(self.response_schema_version)?,
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
            key: key(&self.idempotency_key)?,
            fingerprint: u32::try_from(self.request_version)
                .ok()
                .and_then(|version| Fingerprint::stored(version, &self.fingerprint).ok())
                .ok_or_else(|| corrupt("fingerprint", (self.request_version, &self.fingerprint)))?,
            state: self
                .state
                .parse()
                .map_err(|_| corrupt("state", &self.state))?,
            generation: self.resource_id,
            recovery_point: recovery_point(&self.recovery_point)?,
            locked_until: self.locked_until,
            attempts: Attempt(self.attempts),
            effect_key: self.processor_key,
            effect_id: self.effect_id,
            response,
            created_at: self.created_at,
            expires_at: self.expires_at,
        })
    }
}

/// What a takeover under a claim returns: the attempt number it gave itself and the
/// generation it resumes.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TakenOver {
    attempts: i32,
    resource_id: Uuid,
    processor_key: String,
}

impl TakenOver {
    /// The claim of the attempt that took the record over, resuming `from`.
    pub(crate) fn claimed(self, from: RecoveryPoint, effect_id: Option<String>) -> Claimed {
        Claimed::taken_over(
            Attempt(self.attempts),
            self.resource_id,
            self.processor_key,
            from,
            effect_id,
        )
    }
}

/// A record the completer took over, as its takeover returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AbandonedRow {
    tenant_id: String,
    operation: String,
    idempotency_key: String,
    attempts: i32,
    resource_id: Uuid,
    processor_key: String,
    recovery_point: String,
    effect_id: Option<String>,
    request_body: Option<Vec<u8>>,
    request_version: i32,
}

impl AbandonedRow {
    pub(crate) fn into_abandoned(self) -> Result<Abandoned, Error> {
        Ok(Abandoned {
            key: key(&self.idempotency_key)?,
            scope: Scope {
                tenant: self.tenant_id,
                operation: self.operation,
            },
            attempt: Attempt(self.attempts),
            generation: self.resource_id,
            effect_key: self.processor_key,
            recovery_point: recovery_point(&self.recovery_point)?,
            effect_id: self.effect_id,
            request_body: self.request_body,
            request_version: u32::try_from(self.request_version)
                .map_err(|_| corrupt("request_version", self.request_version))?,
        })
    }
}

/// A new generation of a record: its id (half of its fence) and the key its effect is made
/// under, derived from it, so that every attempt of the generation sends the same one.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub(crate) id: Uuid,
    pub(crate) effect_key: String,
}

impl Generation {
    /// A time-ordered id (a UUID of version 7), which becomes the resource's: new records'
    /// rows go to the end of each index rather than anywhere in it.
    pub(crate) fn new() -> Self {
        let id = Uuid::now_v7();
        Self {
            id,
            effect_key: format!("effect_{}", id.simple()),
        }
    }

    /// The claim of a new request in this generation.
    pub(crate) fn claimed(self, attempts: i32) -> Claimed {
        Claimed::fresh(Attempt(attempts), self.id, self.effect_key)
    }

    /// The claim of a new generation in the row of an expired or failed record.
    pub(crate) fn replacing(self, attempts: i32) -> Claimed {
        Claimed::replacing(Attempt(attempts), self.id, self.effect_key)
    }
}

/// The columns of a stored response: status, headers, body, schema version.
pub(crate) struct ResponseColumns<'a> {
    pub(crate) status: i16,
    pub(crate) headers: serde_json::Value,
    pub(crate) body: &'a [u8],
    pub(crate) schema_version: i64,
}

impl<'a> ResponseColumns<'a> {
    pub(crate) fn of(response: &'a StoredResponse) -> Result<Self, Error> {
        Ok(Self {
            status: i16::try_from(response.status)
                .map_err(|_| corrupt("response_status", response.status))?,
            headers: headers_to_json(&response.headers),
            body: &response.body,
            schema_version: i64::from(response.schema_version.get()),
        })
    }
}

/// Headers are stored as a JSON array of `[name, value]` pairs, keeping their order.
fn headers_to_json(headers: &[(String, String)]) -> serde_json::Value {
    serde_json::Value::Array(
        headers
            .iter()
            .map(|(n, v)| serde_json::json!([n, v]))
            .collect(),
    )
}

fn headers_from_json(value: Option<serde_json::Value>) -> Result<Vec<(String, String)>, Error> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    serde_json::from_value(value).map_err(|e| Error::Corrupt(format!("response_headers: {e}")))
}

/// A stored response's schema version: present, and at least 1.
fn schema_version(stored: Option<i32>) -> Result<SchemaVersion, Error> {
    stored
        .and_then(|version| u32::try_from(version).ok())
        .and_then(SchemaVersion::from_stored)
        .ok_or_else(|| corrupt("response_schema_version", stored))
}

fn key(stored: &str) -> Result<IdempotencyKey, Error> {
    IdempotencyKey::parse(stored).map_err(|e| Error::Corrupt(format!("idempotency_key: {e}")))
}

fn recovery_point(stored: &str) -> Result<RecoveryPoint, Error> {
    stored
        .parse()
        .map_err(|_| corrupt("recovery_point", stored))
}

/// The request version a fingerprint was made under, as the column holds it.
pub(crate) fn request_version(fingerprint: &Fingerprint) -> i64 {
    i64::from(fingerprint.request_version())
}
