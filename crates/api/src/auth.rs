//! API keys: configured as SHA-256 hashes, compared in constant time. A key authenticates a
//! tenant, for the payment endpoints, or an operator, for the operator endpoints (`/ops/`),
//! never both: each kind of endpoint refuses the other kind of key.
//!
//! The service never holds a key in plain text after start-up, so neither a configuration
//! file nor a memory dump reveals one. Every configured hash is compared on every request,
//! without stopping at the first match, so response timing does not tell an attacker how
//! close a guess was.

use axum::http::{HeaderMap, header};
use payments_domain::TenantId;
use sha2::{Digest, Sha256};

use crate::ApiError;

/// An operator, by the name its key is configured with (`auth.operator_keys`): kept with every
/// resolution it makes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperatorName(String);

impl OperatorName {
    /// The most characters a name has.
    pub const MAX_LEN: usize = 64;

    /// A name of 1 to [`Self::MAX_LEN`] ASCII letters, digits, `_`, `-` and `.`: it goes into
    /// logs and records as it is.
    pub fn new(name: &str) -> Option<Self> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        (!name.is_empty() && name.len() <= Self::MAX_LEN && name.chars().all(allowed))
            .then(|| Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Who a key authenticates.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    /// A tenant, for the payment endpoints.
    Tenant(TenantId),
    /// An operator, for the operator endpoints: it sees every tenant's exceptions.
    Operator(OperatorName),
}

/// API key hashes and who each one authenticates.
#[derive(Clone)]
pub struct ApiKeys(std::sync::Arc<Vec<([u8; 32], Principal)>>);

impl ApiKeys {
    /// `entries` are (SHA-256 of the key, tenant).
    pub fn new(entries: Vec<([u8; 32], TenantId)>) -> Self {
        let entries = entries
            .into_iter()
            .map(|(hash, tenant)| (hash, Principal::Tenant(tenant)))
            .collect();
        Self(std::sync::Arc::new(entries))
    }

    /// These keys and the operator keys `operators` (SHA-256 of the key, operator).
    pub fn with_operators(self, operators: Vec<([u8; 32], OperatorName)>) -> Self {
        let mut entries = self.0.as_ref().clone();
        entries.extend(
            operators
                .into_iter()
                .map(|(hash, name)| (hash, Principal::Operator(name))),
        );
        Self(std::sync::Arc::new(entries))
    }

    /// Everyone some key authenticates (once each), tenants first.
    pub fn principals(&self) -> impl Iterator<Item = Principal> {
        let mut principals: Vec<Principal> = self.0.iter().map(|(_, p)| p.clone()).collect();
        principals.sort();
        principals.dedup();
        principals.into_iter()
    }

    /// Whom a presented key authenticates. Every hash is compared, whatever matched before.
    pub fn principal_for(&self, presented: &str) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (hash, principal) in self.0.iter() {
            if constant_time_eq(hash, &digest) {
                found = Some(principal);
            }
        }
        found
    }
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("count", &self.0.len())
            .finish()
    }
}

/// Compares all 32 bytes whatever they hold: the time taken does not depend on where the
/// first difference is.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// The SHA-256 of the demo keys `sk_test_acme` and `sk_test_globex`, which the compiled
/// defaults configure and the README prints: anyone may know them, so they are refused on any
/// address but loopback unless `auth.allow_demo_keys` says otherwise.
pub(crate) const DEMO_KEY_HASHES: [[u8; 32]; 2] = [
    hex_digest(b"0c24ce40313b1ce2b6daefa9dea10a4d3290af661123f6d499a3567b80d5ed49"),
    hex_digest(b"d588a5beb7a21e90ab68a64c0db32cee0d9a75aaec9a8e4ab3f5008f56f84e91"),
];

/// The SHA-256 of the demo operator key `sk_test_ops`, which serves (as the operator `demo`)
/// only beside the demo tenant keys and no operator key: a deployment with keys of its own,
/// tenant or operator, never has it.
pub(crate) const DEMO_OPERATOR_KEY_HASH: [u8; 32] =
    hex_digest(b"72de67260e3993eadfa78c7e7adfc543e4208f3fb542f4c524ff85756abb92d7");

/// The name the demo operator key's reads and resolutions are kept under.
pub(crate) const DEMO_OPERATOR: &str = "demo";

/// 64 hex digits as 32 bytes, at compile time.
const fn hex_digest(hex: &[u8; 64]) -> [u8; 32] {
    const fn nibble(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("not a lower-case hex digit"),
        }
    }
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]);
        i += 1;
    }
    out
}

/// Parses a configured `key_sha256` value.
pub(crate) fn parse_key_hash(hex_digest: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_digest.trim()).ok()?;
    bytes.try_into().ok()
}

/// Whom the API key `headers` carry authenticates. Exactly one `Authorization` header: with
/// two, a proxy in front and this service might each honour a different one.
pub(crate) fn authenticate(headers: &HeaderMap, keys: &ApiKeys) -> Result<Principal, ApiError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or(ApiError::Unauthorized)?;
    if values.next().is_some() {
        return Err(ApiError::AuthorizationRepeated);
    }
    let presented = value
        .to_str()
        .ok()
        .and_then(bearer_token)
        .ok_or(ApiError::Unauthorized)?;
    keys.principal_for(presented)
        .cloned()
        .ok_or(ApiError::Unauthorized)
}

/// The token of a `Bearer` credential; the scheme is case-insensitive (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> ApiKeys {
        let hash = |k: &str| Sha256::digest(k.as_bytes()).into();
        let ops = OperatorName::new("ops").unwrap_or_else(|| panic!("a valid name"));
        ApiKeys::new(vec![
            (hash("sk_a"), TenantId::new("a")),
            (hash("sk_b"), TenantId::new("b")),
        ])
        .with_operators(vec![(hash("sk_ops"), ops)])
    }

    fn tenant(name: &str) -> Principal {
        Principal::Tenant(TenantId::new(name))
    }

    #[test]
    fn a_key_authenticates_its_own_tenant_or_operator_only() {
        let keys = keys();
        assert_eq!(keys.principal_for("sk_a"), Some(&tenant("a")));
        assert_eq!(keys.principal_for("sk_b"), Some(&tenant("b")));
        assert!(matches!(
            keys.principal_for("sk_ops"),
            Some(Principal::Operator(name)) if name.as_str() == "ops"
        ));
        assert_eq!(keys.principal_for("sk_c"), None);
        assert_eq!(keys.principal_for(""), None);
        assert_eq!(keys.principals().count(), 3);
    }

    #[test]
    fn operator_names_are_short_and_plain() {
        assert!(OperatorName::new("alice.ops-1_x").is_some());
        for bad in ["", "has space", "new\nline", "é", &"a".repeat(65)] {
            assert!(OperatorName::new(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn hashes_parse_from_hex_of_exactly_32_bytes() {
        assert!(parse_key_hash(&"ab".repeat(32)).is_some());
        assert!(parse_key_hash(&"ab".repeat(31)).is_none());
        assert!(parse_key_hash("not hex").is_none());
    }

    #[test]
    fn the_demo_hashes_are_those_of_the_demo_keys() {
        let hash = |k: &str| -> [u8; 32] { Sha256::digest(k.as_bytes()).into() };
        assert_eq!(
            DEMO_KEY_HASHES,
            [hash("sk_test_acme"), hash("sk_test_globex")]
        );
        assert_eq!(DEMO_OPERATOR_KEY_HASH, hash("sk_test_ops"));
    }

    #[test]
    fn equality_is_exact() {
        let a = [7u8; 32];
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[31] ^= 1;
        assert!(!constant_time_eq(&a, &b));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_needs_a_token() {
        assert_eq!(bearer_token("Bearer sk_1"), Some("sk_1"));
        assert_eq!(bearer_token("bearer sk_1"), Some("sk_1"));
        assert_eq!(bearer_token("Basic c2tfMQ=="), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }
}
