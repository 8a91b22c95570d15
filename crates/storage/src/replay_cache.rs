//! The Redis replay cache: completed responses, so a replay costs one Redis GET instead of a
//! database round trip. Losing it loses nothing: every entry is also in PostgreSQL.

use chrono::{DateTime, Utc};
use payments_idempotency::{Fingerprint, IdempotencyKey, Scope, StoredResponse};

use crate::redis_link::{RedisFailure, RedisLink};

/// A cached response and the fingerprint of the request that produced it: a hit for another
/// payload is still a mismatch (422), exactly as from the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedReplay {
    pub fingerprint: Fingerprint,
    pub response: StoredResponse,
    /// When the record's retention ends: the entry itself expires at this same instant.
    pub expires_at: DateTime<Utc>,
}

/// Completed responses in Redis, under keys carrying a hash tag so one key's entry lives on
/// one Redis Cluster slot.
#[derive(Debug, Clone)]
pub struct ReplayCache {
    link: RedisLink,
    prefix: String,
}

impl ReplayCache {
    pub fn new(link: RedisLink, prefix: impl Into<String>) -> Self {
        Self {
            link,
            prefix: prefix.into(),
        }
    }

    fn key(&self, scope: &Scope, key: &IdempotencyKey) -> String {
        format!(
            "{}:replay:{{{}:{}:{}}}",
            self.prefix, scope.tenant, scope.operation, key
        )
    }

    /// The cached replay for a key, if any. A corrupt entry reads as a miss.
    pub async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<CachedReplay>, RedisFailure> {
        let bytes: Option<Vec<u8>> = self
            .link
            .query(redis::cmd("GET").arg(self.key(scope, key)))
            .await?;
        Ok(bytes.and_then(|bytes| decode(&bytes)))
    }

    /// One GET of a fixed key: the floor a cached replay is measured against in the
    /// benchmarks.
    pub async fn probe(&self) -> Result<Option<Vec<u8>>, RedisFailure> {
        self.link
            .query(redis::cmd("GET").arg(format!("{}:probe", self.prefix)))
            .await
    }

    /// Stores a completed response until `expires_at`, the record's own expiry, as an
    /// absolute time (`SET .. PXAT`): the entry and the record end at the same instant, so the
    /// cache can never replay a key the database already considers expired.
    pub async fn put(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
    ) -> Result<(), RedisFailure> {
        let Ok(at_millis) = u64::try_from(expires_at.timestamp_millis()) else {
            return Ok(());
        };
        let value = encode(fingerprint, response, expires_at);
        self.link
            .query::<()>(
                redis::cmd("SET")
                    .arg(self.key(scope, key))
                    .arg(value)
                    .arg("PXAT")
                    .arg(at_millis),
            )
            .await
    }

    /// Removes a key's entry: its record was replaced by a new generation.
    pub async fn forget(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), RedisFailure> {
        self.link
            .query::<()>(redis::cmd("DEL").arg(self.key(scope, key)))
            .await
    }
}

// Layout, version 2: [2][fingerprint: 32][expires_at: i64 BE, ms since the epoch]
// [status: u16 BE][headers length: u32 BE][headers JSON][body]. Binary rather than JSON so the
// body is stored as the exact bytes that were sent. An entry of another version is a miss.
const VERSION: u8 = 2;
const FIXED: usize = 32 + 8 + 2 + 4;

fn encode(
    fingerprint: &Fingerprint,
    response: &StoredResponse,
    expires_at: DateTime<Utc>,
) -> Vec<u8> {
    let headers = serde_json::to_vec(&response.headers).unwrap_or_default();
    let mut out = Vec::with_capacity(1 + FIXED + headers.len() + response.body.len());
    out.push(VERSION);
    out.extend_from_slice(fingerprint.as_bytes());
    out.extend_from_slice(&expires_at.timestamp_millis().to_be_bytes());
    out.extend_from_slice(&response.status.to_be_bytes());
    out.extend_from_slice(&u32::try_from(headers.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&headers);
    out.extend_from_slice(&response.body);
    out
}

fn decode(bytes: &[u8]) -> Option<CachedReplay> {
    let (&version, rest) = bytes.split_first()?;
    if version != VERSION || rest.len() < FIXED {
        return None;
    }
    let fingerprint = Fingerprint::from_bytes(&rest[..32]).ok()?;
    let expires_at =
        DateTime::from_timestamp_millis(i64::from_be_bytes(rest[32..40].try_into().ok()?))?;
    let status = u16::from_be_bytes([rest[40], rest[41]]);
    let headers_len = u32::from_be_bytes([rest[42], rest[43], rest[44], rest[45]]) as usize;
    let rest = &rest[FIXED..];
    let headers = serde_json::from_slice(rest.get(..headers_len)?).ok()?;
    let body = rest.get(headers_len..)?.to_vec();
    Some(CachedReplay {
        fingerprint,
        response: StoredResponse {
            status,
            headers,
            body,
        },
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_entry_round_trips_byte_for_byte() {
        let fingerprint = Fingerprint::of_json_request("POST", "/charges", &json!({"amount": 1}));
        let response = StoredResponse::new(
            201,
            [("content-type", "application/json")],
            b"{\"id\":\"ch_1\"}".to_vec(),
        );
        let expires_at = DateTime::from_timestamp_millis(1_800_000_000_123).unwrap_or_default();
        let decoded = decode(&encode(&fingerprint, &response, expires_at));
        assert_eq!(
            decoded,
            Some(CachedReplay {
                fingerprint,
                response,
                expires_at,
            })
        );
    }

    #[test]
    fn truncated_or_foreign_entries_read_as_misses() {
        let fingerprint = Fingerprint::of_json_request("POST", "/charges", &json!({}));
        let encoded = encode(
            &fingerprint,
            &StoredResponse::new(201, [("location", "/x")], b"body".to_vec()),
            Utc::now(),
        );
        assert_eq!(decode(&encoded[..20]), None);
        assert_eq!(decode(&encoded[..45]), None);
        assert_eq!(decode(&encoded[..53]), None);
        assert_eq!(decode(b"{\"status\":201}"), None);
        assert_eq!(decode(&[]), None);
    }
}
