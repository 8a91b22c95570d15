//! A delivery's signature, as the Standard Webhooks specification (1.0) defines it: HMAC-SHA256
//! of `<webhook-id>.<webhook-timestamp>.<body>` under the endpoint secret's key, sent as
//! `v1,<base64>` in `webhook-signature`, one per secret, space-separated, while a secret
//! rotates. The consumer's half is `payments_client::webhooks::Verifier`; the tests hold the two
//! to the specification's reference delivery, and to each other.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// What a secret starts with, as the specification and every consumer library expect.
const PREFIX: &str = "whsec_";

/// The bytes of a new secret's key: 256 bits, as HMAC-SHA256's block allows many more.
const KEY_BYTES: usize = 32;

/// An endpoint's signing secret. Shown once, when it is made; kept by the service to sign;
/// never logged (its `Debug` shows nothing of it).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A secret's text that is not `whsec_` and base64 of a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a webhook secret is `whsec_` followed by the base64 of a key")]
pub struct SecretError;

impl Secret {
    /// A new secret of random bytes.
    pub fn generate() -> Self {
        let mut key = vec![0_u8; KEY_BYTES];
        rand::rng().fill_bytes(&mut key);
        Self { key }
    }

    /// Reads a secret as [`Secret::expose`] wrote it.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let key = text
            .strip_prefix(PREFIX)
            .and_then(|encoded| BASE64.decode(encoded).ok())
            .filter(|key| !key.is_empty())
            .ok_or(SecretError)?;
        Ok(Self { key })
    }

    /// The secret as its endpoint's owner is given it, and as it is stored: `whsec_<base64>`.
    pub fn expose(&self) -> String {
        format!("{PREFIX}{}", BASE64.encode(&self.key))
    }

    /// The `v1,<base64>` signature of `body` delivered as `webhook_id` at `timestamp`
    /// (seconds since the epoch, as the `webhook-timestamp` header says it).
    pub fn sign(&self, webhook_id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC takes a key of any length, and `parse` and `generate` never make an empty one.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts a key of any length"));
        mac.update(webhook_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header of a delivery under `secrets` (the endpoint's current secret,
/// and the one it replaced while their overlap lasts): one signature each, space-separated.
pub fn signature_header(
    secrets: &[&Secret],
    webhook_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    let signatures: Vec<String> = secrets
        .iter()
        .map(|secret| secret.sign(webhook_id, timestamp, body))
        .collect();
    signatures.join(" ")
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use payments_client::webhooks::Verifier;

    use super::*;

    fn secret(text: &str) -> Secret {
        Secret::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_specifications_reference_delivery_is_signed_as_published() {
        let secret = secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert_eq!(
            secret.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_rotating_endpoint_signs_with_both_secrets_and_either_verifies() {
        let (old, new) = (Secret::generate(), Secret::generate());
        assert_ne!(old, new);
        let body = br#"{"id":"evt_1"}"#;
        let header = signature_header(&[&new, &old], "evt_1", 1_700_000_000, body);
        assert_eq!(header.split(' ').count(), 2, "{header}");
        let at = DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_else(|| unreachable!());
        for held in [&old, &new] {
            let verifier = Verifier::new(&held.expose()).unwrap_or_else(|e| panic!("{e}"));
            let verified = verifier.verify_parts("evt_1", "1700000000", &header, body, at);
            assert!(verified.is_ok(), "{verified:?}");
        }
        let stranger =
            Verifier::new(&Secret::generate().expose()).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            stranger
                .verify_parts("evt_1", "1700000000", &header, body, at)
                .is_err()
        );
    }

    #[test]
    fn a_secret_round_trips_and_is_never_shown() {
        let made = Secret::generate();
        assert_eq!(Secret::parse(&made.expose()), Ok(made.clone()));
        assert!(made.expose().starts_with("whsec_"));
        assert_eq!(format!("{made:?}"), "Secret(..)");
        for text in [
            "",
            "whsec_",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_***",
        ] {
            assert_eq!(Secret::parse(text), Err(SecretError), "{text:?}");
        }
    }
}
