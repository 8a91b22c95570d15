//! The caller's memory of its logical operations, so that a caller that crashes and starts
//! again resumes each one under the key it already sent, and never makes a second charge.
//!
//! An operation is recorded, with its request, its key, the service and the tenant it is sent
//! to and the time, before its first send; its answer is recorded when the service gives one
//! it stores under the key (the answer carries `Idempotency-Key-Expires`) and that answers the
//! request sent. A restarted caller that finds an operation with no answer sends it again under
//! the same key while the service surely holds the key (the `retention` module), and asks the
//! service about the key first after that: the service finishes or replays what the first run
//! started, and a key it no longer holds is never sent again. One that finds the answer has it
//! without asking. An entry is the service's and the tenant's that recorded it: the same name
//! under another base URL or another API key is refused before anything is sent.
//! [`FileJournal`] keeps the records in a file; another store implements [`Journal`].

mod file;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use file::FileJournal;

/// One logical operation as the journal holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The caller's name for the operation, unique within the journal.
    pub name: String,
    /// The request: method, path and a SHA-256 of the body, so that a restart that asks for
    /// something else under the same name is caught before anything is sent.
    pub request: String,
    /// The `Idempotency-Key` every attempt sends.
    pub key: String,
    /// The service's base URL the operation was sent to (empty in an entry written before
    /// entries named it, which no service matches).
    #[serde(default)]
    pub base_url: String,
    /// Whose operation it is: [`api_key_fingerprint`] of the API key that sent it, never the
    /// key itself (empty in an entry written before entries named it).
    #[serde(default)]
    pub api_key_fingerprint: String,
    /// When the entry was recorded, just before the key's first send, in seconds since the
    /// Unix epoch; absent in an entry written before entries named it, which counts as long
    /// ago.
    #[serde(default)]
    pub recorded_at: Option<u64>,
    /// The key retention the client was told at the first send, in seconds: a later run told
    /// a longer one still keeps to this.
    #[serde(default)]
    pub key_retention_secs: Option<u64>,
    /// The service's final answer, once it gave one.
    pub answer: Option<RecordedAnswer>,
}

/// A final answer, as the service sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedAnswer {
    pub status: u16,
    /// `Idempotency-Key-Expires`: until when the service replays it.
    pub key_expires: String,
    /// The body, as JSON.
    pub body: serde_json::Value,
}

/// Why the journal cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[error("journal {path}: {reason}")]
pub struct JournalError {
    pub path: String,
    pub reason: String,
}

/// Where operations and their keys are kept. [`record`](Journal::record) returns only once the
/// entry is durable: the client sends nothing before the key is recorded.
pub trait Journal: Send + Sync + std::fmt::Debug {
    /// The operation recorded under `name`, if any.
    fn entry(&self, name: &str) -> Result<Option<JournalEntry>, JournalError>;
    /// Records `entry`, replacing any entry of the same name.
    fn record(&self, entry: &JournalEntry) -> Result<(), JournalError>;
}

/// What an entry records of an API key: `sha256:` and 32 hex digits of a hash of it, enough
/// to tell two keys apart and useless for calling the service.
pub fn api_key_fingerprint(api_key: &str) -> String {
    // A hash of its own kind, so that it matches no other digest of the key.
    let digest = Sha256::digest(format!("payments-client journal\n{api_key}"));
    format!("sha256:{}", hex::encode(&digest[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_s_fingerprint_tells_keys_apart_and_does_not_hold_the_key() {
        let acme = api_key_fingerprint("sk_test_acme");
        assert_eq!(acme, api_key_fingerprint("sk_test_acme"));
        assert_ne!(acme, api_key_fingerprint("sk_test_globex"));
        assert!(
            acme.starts_with("sha256:") && acme.len() == 7 + 32,
            "{acme}"
        );
        assert!(!acme.contains("acme"));
    }

    #[test]
    fn an_entry_written_before_entries_named_their_service_reads_as_no_one_s() {
        let line = r#"{"name":"n","request":"POST /charges sha256:00","key":"k","answer":null}"#;
        let entry: JournalEntry = serde_json::from_str(line).expect("an entry");
        assert_eq!(
            (entry.base_url.as_str(), entry.api_key_fingerprint.as_str()),
            ("", "")
        );
        assert_eq!((entry.recorded_at, entry.key_retention_secs), (None, None));
    }
}
