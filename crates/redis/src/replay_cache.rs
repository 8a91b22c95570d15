//! The Redis replay cache: completed responses, so a replay costs one Redis GET instead of a
//! database round trip. Losing it loses nothing: every entry is also in the database.
//!
//! Redis is not trusted. Anyone who can write to it could otherwise plant an answer for any
//! key, a made-up success for a charge that never happened included. So every entry carries an
//! HMAC-SHA256, under a secret that never goes to Redis, over where it belongs (the prefix, the
//! tenant, the operation's family and the key: the record's identity, whichever schema version
//! answers) and over everything it says (the record's generation, the fingerprint, the expiry,
//! the status, the schema version that wrote it, the headers and the body). An entry that fails the
//! check, or that does not parse, is a miss, and the request goes on to the database.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use payments_idempotency::engine::{CacheFailure, CacheRead, CachedReplay, ResponseCache};
use payments_idempotency::{Fingerprint, IdempotencyKey, SchemaVersion, Scope, StoredResponse};
use sha2::Sha256;
use uuid::Uuid;

use crate::link::{RedisFailure, RedisLink};

/// Why an entry was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Too short to hold a MAC, or of another format version (an old entry, or not ours).
    #[error("not an entry of this format")]
    Format,
    /// The MAC does not match: forged or edited, or written under another secret.
    #[error("its MAC does not match")]
    Mac,
    /// Authentic, yet its content does not parse: written by a build with a bug.
    #[error("its content does not parse")]
    Content,
}

/// The key of the replay cache's MAC: at least [`CacheSecret::MIN_LEN`] bytes, never printed.
/// Kept as the HMAC state already keyed with it, so each entry costs only its own bytes.
#[derive(Clone)]
pub struct CacheSecret(Hmac<Sha256>);

impl CacheSecret {
    /// The shortest secret accepted: as long as the HMAC-SHA256 output.
    pub const MIN_LEN: usize = 32;

    pub fn new(secret: &[u8]) -> Result<Self, CacheSecretTooShort> {
        if secret.len() < Self::MIN_LEN {
            return Err(CacheSecretTooShort);
        }
        // HMAC takes a key of any length, so this cannot fail once the length is checked.
        let keyed =
            <Hmac<Sha256> as Mac>::new_from_slice(secret).map_err(|_| CacheSecretTooShort)?;
        Ok(Self(keyed))
    }
}

impl std::fmt::Debug for CacheSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheSecret(***)")
    }
}

/// A secret shorter than [`CacheSecret::MIN_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be at least {} bytes", CacheSecret::MIN_LEN)]
pub struct CacheSecretTooShort;

/// Completed responses in Redis, under keys carrying a hash tag so one key's entry lives on
/// one Redis Cluster slot.
#[derive(Debug, Clone)]
pub struct ReplayCache {
    link: RedisLink,
    prefix: String,
    secret: CacheSecret,
}

impl ReplayCache {
    pub fn new(link: RedisLink, prefix: impl Into<String>, secret: CacheSecret) -> Self {
        Self {
            link,
            prefix: prefix.into(),
            secret,
        }
    }

    fn key(&self, scope: &Scope, key: &IdempotencyKey) -> String {
        format!(
            "{}:replay:{{{}:{}:{}}}",
            self.prefix, scope.tenant, scope.operation, key
        )
    }

    /// One GET of a fixed key: the floor a cached replay is measured against in the
    /// benchmarks.
    pub async fn probe(&self) -> Result<Option<Vec<u8>>, RedisFailure> {
        self.link
            .query(redis::cmd("GET").arg(format!("{}:probe", self.prefix)))
            .await
    }

    /// The entry's bytes followed by their MAC.
    fn seal(&self, scope: &Scope, key: &IdempotencyKey, entry: &CachedReplay) -> Vec<u8> {
        let mut bytes = encode(entry);
        let mac = self.mac(scope, key, &bytes).finalize().into_bytes();
        bytes.extend_from_slice(&mac);
        bytes
    }

    /// The entry in `bytes`, once its MAC proves this service wrote it for this key.
    fn open(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        bytes: &[u8],
    ) -> Result<CachedReplay, Rejection> {
        if bytes.first() != Some(&VERSION) || bytes.len() < 1 + FIXED + MAC_LEN {
            return Err(Rejection::Format);
        }
        let (content, mac) = bytes.split_at(bytes.len() - MAC_LEN);
        // `verify_slice` compares in constant time.
        self.mac(scope, key, content)
            .verify_slice(mac)
            .map_err(|_| Rejection::Mac)?;
        decode(content).ok_or(Rejection::Content)
    }

    /// The MAC over where an entry belongs and what it holds. Every variable-length part is
    /// preceded by its length, so no two different inputs run together into the same bytes.
    fn mac(&self, scope: &Scope, key: &IdempotencyKey, content: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.secret.0.clone();
        for part in [
            MAC_CONTEXT.as_bytes(),
            self.prefix.as_bytes(),
            scope.tenant.as_bytes(),
            scope.operation.as_bytes(),
            key.as_str().as_bytes(),
            content,
        ] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }
}

/// The engine's cache port: a failed call is the engine's to work around.
#[async_trait]
impl ResponseCache for ReplayCache {
    /// The cached replay for a key, if an authentic one is there.
    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<CacheRead, CacheFailure> {
        let bytes: Option<Vec<u8>> = self
            .link
            .query(redis::cmd("GET").arg(self.key(scope, key)))
            .await?;
        Ok(match bytes {
            None => CacheRead::Miss,
            Some(bytes) => match self.open(scope, key, &bytes) {
                Ok(hit) => CacheRead::Hit(hit),
                Err(rejection) => CacheRead::Rejected(Box::new(rejection)),
            },
        })
    }

    /// Stores a completed response of the record's `generation` until `expires_at`, the
    /// record's own expiry, as an absolute time (`SET .. PXAT`): the entry and the record end
    /// at the same instant, so the cache can never replay a key the database already
    /// considers expired.
    async fn put(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        generation: Uuid,
        fingerprint: &Fingerprint,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
    ) -> Result<(), CacheFailure> {
        let Ok(at_millis) = u64::try_from(expires_at.timestamp_millis()) else {
            return Ok(());
        };
        let entry = CachedReplay {
            generation,
            fingerprint: fingerprint.to_stored(),
            response: response.clone(),
            expires_at,
        };
        let value = self.seal(scope, key, &entry);
        self.link
            .query::<()>(
                redis::cmd("SET")
                    .arg(self.key(scope, key))
                    .arg(value)
                    .arg("PXAT")
                    .arg(at_millis),
            )
            .await?;
        Ok(())
    }

    /// Removes a key's entry: its record was replaced by a new generation.
    async fn forget(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), CacheFailure> {
        self.link
            .query::<()>(redis::cmd("DEL").arg(self.key(scope, key)))
            .await?;
        Ok(())
    }
}

// Layout, version 4: [4][generation: 16][request version: u32 BE][fingerprint: 32][expires_at:
// i64 BE, ms since the epoch][status: u16 BE][schema version: u32 BE][headers length: u32 BE]
// [headers JSON][body][HMAC-SHA256: 32]. Binary rather than JSON so the body is stored as the exact bytes that
// were sent. An entry of another version is a miss (version 2 had no MAC; version 3 was keyed
// by the operation with its schema version, and did not say which version wrote it).
const VERSION: u8 = 4;
const FIXED: usize = 16 + 4 + 32 + 8 + 2 + 4 + 4;
const MAC_LEN: usize = 32;
/// Names what the MAC is for, so the same secret can never authenticate anything else.
const MAC_CONTEXT: &str = "payments replay cache v4";

fn encode(entry: &CachedReplay) -> Vec<u8> {
    let response = &entry.response;
    let headers = serde_json::to_vec(&response.headers).unwrap_or_default();
    let mut out = Vec::with_capacity(1 + FIXED + headers.len() + response.body.len() + MAC_LEN);
    out.push(VERSION);
    out.extend_from_slice(entry.generation.as_bytes());
    out.extend_from_slice(&entry.fingerprint.request_version().to_be_bytes());
    out.extend_from_slice(entry.fingerprint.as_bytes());
    out.extend_from_slice(&entry.expires_at.timestamp_millis().to_be_bytes());
    out.extend_from_slice(&response.status.to_be_bytes());
    out.extend_from_slice(&response.schema_version.get().to_be_bytes());
    out.extend_from_slice(&u32::try_from(headers.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&headers);
    out.extend_from_slice(&response.body);
    out
}

/// The entry in authenticated `content` (without its MAC). Even an authentic entry goes back
/// through [`StoredResponse::new`], so only allow-listed headers ever leave the cache, and a
/// status that is not a final answer is refused.
fn decode(content: &[u8]) -> Option<CachedReplay> {
    let rest = content.get(1..)?;
    let generation = Uuid::from_slice(rest.get(..16)?).ok()?;
    let request_version = u32::from_be_bytes(rest.get(16..20)?.try_into().ok()?);
    let fingerprint = Fingerprint::stored(request_version, rest.get(20..52)?).ok()?;
    let expires_at =
        DateTime::from_timestamp_millis(i64::from_be_bytes(rest.get(52..60)?.try_into().ok()?))?;
    let status = u16::from_be_bytes(rest.get(60..62)?.try_into().ok()?);
    let schema_version =
        SchemaVersion::from_stored(u32::from_be_bytes(rest.get(62..66)?.try_into().ok()?))?;
    let headers_len = u32::from_be_bytes(rest.get(66..70)?.try_into().ok()?) as usize;
    let rest = rest.get(FIXED..)?;
    let headers: Vec<(String, String)> = serde_json::from_slice(rest.get(..headers_len)?).ok()?;
    let body = rest.get(headers_len..)?.to_vec();
    if !StoredResponse::is_final_status(status) {
        return None;
    }
    let response = StoredResponse::new(
        schema_version,
        status,
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        body,
    );
    Some(CachedReplay {
        generation,
        fingerprint,
        response,
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cache(secret: &[u8]) -> ReplayCache {
        let link = RedisLink::new("redis://127.0.0.1:1", std::time::Duration::from_millis(1))
            .unwrap_or_else(|e| panic!("{e}"));
        let secret = CacheSecret::new(secret).unwrap_or_else(|e| panic!("{e}"));
        ReplayCache::new(link, "test", secret)
    }

    fn scope(tenant: &str) -> Scope {
        Scope {
            tenant: tenant.into(),
            operation: "charges.create".into(),
        }
    }

    fn key(text: &str) -> IdempotencyKey {
        IdempotencyKey::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn entry() -> CachedReplay {
        CachedReplay {
            generation: Uuid::from_u128(7),
            fingerprint: Fingerprint::of_request(
                3,
                "POST",
                "/charges",
                &json!({"amount": 1}),
                &json!({}),
            )
            .to_stored(),
            response: StoredResponse::new(
                SchemaVersion::new(2),
                201,
                [
                    ("content-type", "application/json"),
                    ("location", "/charges/ch_1"),
                ],
                b"{\"id\":\"ch_1\"}".to_vec(),
            ),
            expires_at: DateTime::from_timestamp_millis(1_800_000_000_123).unwrap_or_default(),
        }
    }

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn an_entry_round_trips_byte_for_byte() {
        let cache = cache(SECRET);
        let sealed = cache.seal(&scope("acme"), &key("k"), &entry());
        assert_eq!(cache.open(&scope("acme"), &key("k"), &sealed), Ok(entry()));
    }

    #[test]
    fn an_entry_opens_only_under_its_own_secret_tenant_operation_and_key() {
        let cache = cache(SECRET);
        let sealed = cache.seal(&scope("acme"), &key("k"), &entry());
        let other = self::cache(b"another secret of at least 32 bytes!");
        assert_eq!(
            other.open(&scope("acme"), &key("k"), &sealed),
            Err(Rejection::Mac)
        );
        assert_eq!(
            cache.open(&scope("globex"), &key("k"), &sealed),
            Err(Rejection::Mac)
        );
        assert_eq!(
            cache.open(&scope("acme"), &key("k2"), &sealed),
            Err(Rejection::Mac)
        );
        let mut refunds = scope("acme");
        refunds.operation = "refunds.create".into();
        assert_eq!(
            cache.open(&refunds, &key("k"), &sealed),
            Err(Rejection::Mac)
        );
    }

    #[test]
    fn any_edited_byte_is_rejected() {
        let cache = cache(SECRET);
        let sealed = cache.seal(&scope("acme"), &key("k"), &entry());
        for at in 1..sealed.len() {
            let mut edited = sealed.clone();
            edited[at] ^= 0x01;
            assert_eq!(
                cache.open(&scope("acme"), &key("k"), &edited),
                Err(Rejection::Mac),
                "byte {at}"
            );
        }
    }

    #[test]
    fn truncated_unsigned_or_foreign_entries_are_rejected() {
        let cache = cache(SECRET);
        let sealed = cache.seal(&scope("acme"), &key("k"), &entry());
        let open = |bytes: &[u8]| cache.open(&scope("acme"), &key("k"), bytes);
        assert_eq!(open(&sealed[..sealed.len() - MAC_LEN]), Err(Rejection::Mac));
        assert_eq!(open(&sealed[..20]), Err(Rejection::Format));
        assert_eq!(open(b"{\"status\":201}"), Err(Rejection::Format));
        assert_eq!(open(&[]), Err(Rejection::Format));
        for older in [2, 3] {
            let mut older_format = sealed.clone();
            older_format[0] = older;
            assert_eq!(open(&older_format), Err(Rejection::Format));
        }
    }

    #[test]
    fn even_an_authentic_entry_replays_only_allow_listed_headers_and_final_statuses() {
        let cache = cache(SECRET);
        let mut raw = entry();
        raw.response
            .headers
            .push(("set-cookie".into(), "a=b".into()));
        let sealed = cache.seal(&scope("acme"), &key("k"), &raw);
        let opened = cache.open(&scope("acme"), &key("k"), &sealed);
        assert_eq!(
            opened.map(|e| e.response.headers),
            Ok(entry().response.headers)
        );
        for status in [101, 302, 500, 999] {
            let mut raw = entry();
            raw.response.status = status;
            let sealed = cache.seal(&scope("acme"), &key("k"), &raw);
            assert_eq!(
                cache.open(&scope("acme"), &key("k"), &sealed),
                Err(Rejection::Content),
                "status {status}"
            );
        }
    }

    #[test]
    fn a_secret_shorter_than_32_bytes_is_refused() {
        assert!(CacheSecret::new(&[0; 31]).is_err());
        assert!(CacheSecret::new(&[0; 32]).is_ok());
        assert_eq!(
            format!("{:?}", CacheSecret::new(SECRET).ok()),
            "Some(CacheSecret(***))"
        );
    }
}
