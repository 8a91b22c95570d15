//! The consumer's half of webhooks: checking that a delivery was signed with the endpoint's
//! secret, recently, as the Standard Webhooks specification (1.0) says.
//!
//! A delivery carries three headers: `webhook-id` (the event's id, the same on every attempt),
//! `webhook-timestamp` (seconds since the epoch, fresh on every attempt) and
//! `webhook-signature`, a space-separated list of `v1,<base64 HMAC-SHA256>` signatures of
//! `<id>.<timestamp>.<body>` under the secret's key, more than one while a secret rotates. A
//! delivery is accepted when one `v1` signature is the whole HMAC of exactly those bytes and the
//! timestamp is within the tolerance of now, either way: an old delivery replayed, or one signed
//! with a clock far ahead, is refused. Nothing else is trusted: an empty or truncated signature,
//! a signature of another version, an unparsable header are all refusals.
//!
//! Verifying is only half of the consumer's duty. The service delivers at least once, for days,
//! so the same event can arrive again long after it was applied: a consumer applies each
//! `webhook-id` once, by keeping the ids it applied in the transaction that applies the event
//! (`examples/` shows one).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, TimeDelta, Utc};
use hmac::{Hmac, Mac};
use reqwest::header::HeaderMap;
use sha2::Sha256;

/// The header that names the event, the same on every attempt.
pub const WEBHOOK_ID: &str = "webhook-id";
/// The header that says when the attempt was signed, in seconds since the epoch.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The header that carries the attempt's signatures.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// How far a delivery's timestamp may be from now, either way: the specification's five
/// minutes.
pub const DEFAULT_TOLERANCE: TimeDelta = TimeDelta::minutes(5);

/// What a signing secret starts with.
const SECRET_PREFIX: &str = "whsec_";

/// The only signature version there is: HMAC-SHA256.
const V1: &str = "v1";

/// Why a secret cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a webhook secret is `whsec_` followed by base64: {0}")]
    Malformed(&'static str),
}

/// Why a delivery was refused. Each means: do not apply it, answer 4xx.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the delivery has no {0} header, or it is not text")]
    MissingHeader(&'static str),
    #[error("the webhook-timestamp header is not a number of seconds")]
    InvalidTimestamp,
    #[error("the delivery was signed too long ago (replayed?)")]
    TooOld,
    #[error("the delivery was signed too far in the future")]
    TooNew,
    #[error("the delivery carries no v1 signature")]
    NoSignature,
    #[error("no signature of the delivery is the endpoint secret's")]
    NoMatchingSignature,
}

/// A delivery that passed: its event id and when it was signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub webhook_id: String,
    pub signed_at: DateTime<Utc>,
}

/// Checks deliveries against one endpoint secret. Keep one per secret: while a secret rotates,
/// the service signs with both, so a consumer holding either accepts every delivery.
#[derive(Clone)]
pub struct Verifier {
    key: Vec<u8>,
    tolerance: TimeDelta,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is never shown.
        f.debug_struct("Verifier")
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier of `secret` (`whsec_<base64>`, as the service gave it) with the default
    /// tolerance.
    pub fn new(secret: &str) -> Result<Self, SecretError> {
        let encoded = secret
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::Malformed("the prefix is missing"))?;
        let key = BASE64
            .decode(encoded)
            .map_err(|_| SecretError::Malformed("the key is not base64"))?;
        if key.is_empty() {
            return Err(SecretError::Malformed("the key is empty"));
        }
        Ok(Self {
            key,
            tolerance: DEFAULT_TOLERANCE,
        })
    }

    /// The same verifier with another tolerance.
    pub fn with_tolerance(mut self, tolerance: TimeDelta) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies a delivery from its headers and its body exactly as received, at `now`.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Verified, VerifyError> {
        let header = |name: &'static str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .ok_or(VerifyError::MissingHeader(name))
        };
        self.verify_parts(
            header(WEBHOOK_ID)?,
            header(WEBHOOK_TIMESTAMP)?,
            header(WEBHOOK_SIGNATURE)?,
            body,
            now,
        )
    }

    /// Verifies a delivery from the three headers' values and its body, at `now`.
    pub fn verify_parts(
        &self,
        webhook_id: &str,
        timestamp: &str,
        signatures: &str,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Verified, VerifyError> {
        let signed_at = timestamp
            .parse::<i64>()
            .ok()
            .and_then(|seconds| DateTime::from_timestamp(seconds, 0))
            .ok_or(VerifyError::InvalidTimestamp)?;
        if signed_at < now - self.tolerance {
            return Err(VerifyError::TooOld);
        }
        if signed_at > now + self.tolerance {
            return Err(VerifyError::TooNew);
        }
        // The body is hashed once, however many signatures the header lists: a header of many
        // signatures must not make a delivery cost a hash of its body each.
        let expected = self.mac(webhook_id, timestamp, body);
        let mut any_v1 = false;
        for signature in signatures.split(' ') {
            let Some((V1, encoded)) = signature.split_once(',') else {
                continue;
            };
            any_v1 = true;
            let Ok(given) = BASE64.decode(encoded) else {
                continue;
            };
            // The whole tag, compared in constant time: a truncated one never matches.
            if expected.clone().verify_slice(&given).is_ok() {
                return Ok(Verified {
                    webhook_id: webhook_id.to_owned(),
                    signed_at,
                });
            }
        }
        Err(if any_v1 {
            VerifyError::NoMatchingSignature
        } else {
            VerifyError::NoSignature
        })
    }

    /// The `v1,<base64>` signature of a delivery of `body` as `webhook_id` at `timestamp`
    /// (seconds): what the service sends, for a test's or a tool's own deliveries.
    pub fn sign(&self, webhook_id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self
            .mac(webhook_id, &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        format!("{V1},{}", BASE64.encode(tag))
    }

    fn mac(&self, webhook_id: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes a key of any length; `new` refused an empty one.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts a key of any length"));
        mac.update(webhook_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's reference delivery.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: &str = "1614265330";
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn signed_at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_614_265_330, 0).unwrap_or_else(|| unreachable!())
    }

    fn verifier() -> Verifier {
        Verifier::new(SECRET).unwrap_or_else(|e| panic!("{e}"))
    }

    fn verify(signatures: &str, body: &[u8], now: DateTime<Utc>) -> Result<Verified, VerifyError> {
        verifier().verify_parts(ID, TIMESTAMP, signatures, body, now)
    }

    #[test]
    fn the_specifications_reference_delivery_verifies_and_signs_the_same() {
        let verified = verify(SIGNATURE, BODY, signed_at());
        assert_eq!(
            verified,
            Ok(Verified {
                webhook_id: ID.into(),
                signed_at: signed_at(),
            })
        );
        assert_eq!(verifier().sign(ID, 1_614_265_330, BODY), SIGNATURE);
    }

    #[test]
    fn one_matching_signature_among_several_is_enough() {
        let rotating = format!("v1,bm90IHRoaXMgb25l {SIGNATURE} v2,whatever");
        assert!(verify(&rotating, BODY, signed_at()).is_ok());
    }

    #[test]
    fn another_secret_another_body_or_another_id_is_refused() {
        let other = Verifier::new("whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQ=")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            other.verify_parts(ID, TIMESTAMP, SIGNATURE, BODY, signed_at()),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            verify(SIGNATURE, br#"{"test": 2432232315}"#, signed_at()),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            verifier().verify_parts("msg_other", TIMESTAMP, SIGNATURE, BODY, signed_at()),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn a_stale_or_future_timestamp_is_refused_even_with_its_signature() {
        let six_minutes = TimeDelta::minutes(6);
        assert_eq!(
            verify(SIGNATURE, BODY, signed_at() + six_minutes),
            Err(VerifyError::TooOld)
        );
        assert_eq!(
            verify(SIGNATURE, BODY, signed_at() - six_minutes),
            Err(VerifyError::TooNew)
        );
        let four_minutes = TimeDelta::minutes(4);
        assert!(verify(SIGNATURE, BODY, signed_at() + four_minutes).is_ok());
        let lenient = verifier().with_tolerance(TimeDelta::minutes(10));
        assert!(
            lenient
                .verify_parts(ID, TIMESTAMP, SIGNATURE, BODY, signed_at() + six_minutes)
                .is_ok()
        );
        for timestamp in ["", "16142653300000000000000", "1614265330.5", "-"] {
            assert_eq!(
                verifier().verify_parts(ID, timestamp, SIGNATURE, BODY, signed_at()),
                Err(VerifyError::InvalidTimestamp),
                "{timestamp:?}"
            );
        }
    }

    #[test]
    fn an_empty_truncated_or_unversioned_signature_is_refused() {
        let truncated = &SIGNATURE[..SIGNATURE.len() - 8];
        let one_byte_short = {
            let tag = BASE64
                .decode(&SIGNATURE[3..])
                .unwrap_or_else(|e| panic!("{e}"));
            format!("v1,{}", BASE64.encode(&tag[..tag.len() - 1]))
        };
        let cases = [
            ("", VerifyError::NoSignature),
            (" ", VerifyError::NoSignature),
            ("v1,", VerifyError::NoMatchingSignature),
            ("v1", VerifyError::NoSignature),
            (truncated, VerifyError::NoMatchingSignature),
            (&one_byte_short, VerifyError::NoMatchingSignature),
            (&SIGNATURE[3..], VerifyError::NoSignature),
            (
                "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
                VerifyError::NoSignature,
            ),
        ];
        for (signatures, refused) in cases {
            assert_eq!(
                verify(signatures, BODY, signed_at()),
                Err(refused),
                "{signatures:?}"
            );
        }
    }

    #[test]
    fn headers_are_read_by_their_names_and_a_missing_one_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(WEBHOOK_ID, ID.parse().unwrap_or_else(|_| unreachable!()));
        headers.insert(
            WEBHOOK_TIMESTAMP,
            TIMESTAMP.parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(
            verifier().verify(&headers, BODY, signed_at()),
            Err(VerifyError::MissingHeader(WEBHOOK_SIGNATURE))
        );
        headers.insert(
            WEBHOOK_SIGNATURE,
            SIGNATURE.parse().unwrap_or_else(|_| unreachable!()),
        );
        assert!(verifier().verify(&headers, BODY, signed_at()).is_ok());
    }

    #[test]
    fn a_secret_is_whsec_and_base64_of_a_key() {
        for secret in [
            "",
            "whsec_",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!!",
        ] {
            assert!(Verifier::new(secret).is_err(), "{secret:?}");
        }
        let shown = format!("{:?}", verifier());
        assert!(!shown.contains("MfKQ"), "{shown}");
    }
}
