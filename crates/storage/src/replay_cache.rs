//! The Redis replay cache: completed responses, so a replay costs one Redis GET instead of a
//! database round trip. Losing it loses nothing: every entry is also in PostgreSQL.

use std::time::Duration;

use payments_idempotency::{Fingerprint, IdempotencyKey, Scope, StoredResponse};

use crate::redis_link::{RedisFailure, RedisLink};

/// A cached response and the fingerprint of the request that produced it: a hit for another
/// payload is still a mismatch (422), exactly as from the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedReplay {
    pub fingerprint: Fingerprint,
    pub response: StoredResponse,
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

    /// Stores a completed response for `ttl` (the record's remaining retention, so the cache
    /// can never replay a key the database already considers expired).
    pub async fn put(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<(), RedisFailure> {
        let millis = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if millis == 0 {
            return Ok(());
        }
        let value = encode(fingerprint, response);
        self.link
            .query::<()>(
                redis::cmd("SET")
                    .arg(self.key(scope, key))
                    .arg(value)
                    .arg("PX")
                    .arg(millis),
            )
            .await
    }
}

// Layout, version 1: [1][fingerprint: 32][status: u16 BE][headers length: u32 BE][headers JSON][body].
// Binary rather than JSON so the body is stored as the exact bytes that were sent.
const VERSION: u8 = 1;

fn encode(fingerprint: &Fingerprint, response: &StoredResponse) -> Vec<u8> {
    let headers = serde_json::to_vec(&response.headers).unwrap_or_default();
    let mut out = Vec::with_capacity(39 + headers.len() + response.body.len());
    out.push(VERSION);
    out.extend_from_slice(fingerprint.as_bytes());
    out.extend_from_slice(&response.status.to_be_bytes());
    out.extend_from_slice(&u32::try_from(headers.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&headers);
    out.extend_from_slice(&response.body);
    out
}

fn decode(bytes: &[u8]) -> Option<CachedReplay> {
    let (&version, rest) = bytes.split_first()?;
    if version != VERSION || rest.len() < 38 {
        return None;
    }
    let fingerprint = Fingerprint::from_bytes(&rest[..32]).ok()?;
    let status = u16::from_be_bytes([rest[32], rest[33]]);
    let headers_len = u32::from_be_bytes([rest[34], rest[35], rest[36], rest[37]]) as usize;
    let rest = &rest[38..];
    let headers = serde_json::from_slice(rest.get(..headers_len)?).ok()?;
    let body = rest.get(headers_len..)?.to_vec();
    Some(CachedReplay {
        fingerprint,
        response: StoredResponse {
            status,
            headers,
            body,
        },
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
        let decoded = decode(&encode(&fingerprint, &response));
        assert_eq!(
            decoded,
            Some(CachedReplay {
                fingerprint,
                response
            })
        );
    }

    #[test]
    fn truncated_or_foreign_entries_read_as_misses() {
        let fingerprint = Fingerprint::of_json_request("POST", "/charges", &json!({}));
        let encoded = encode(
            &fingerprint,
            &StoredResponse::new(201, [("location", "/x")], b"body".to_vec()),
        );
        assert_eq!(decode(&encoded[..20]), None);
        assert_eq!(decode(&encoded[..45]), None);
        assert_eq!(decode(b"{\"status\":201}"), None);
        assert_eq!(decode(&[]), None);
    }
}
