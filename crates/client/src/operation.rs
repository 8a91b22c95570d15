//! [`Operation`]: one logical operation and its key; [`Answer`]: what it answered.

use std::time::SystemTime;

/// One logical operation: what the caller means to happen once. Its `Idempotency-Key` is made
/// when the operation is, before the first send, and every attempt sends it; a new operation
/// is a new key, never a new attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    key: String,
    key_given: bool,
    journal_name: Option<String>,
}

impl Operation {
    /// A new operation under a new random key (a UUID).
    pub fn new() -> Self {
        Self {
            key: uuid::Uuid::new_v4().to_string(),
            key_given: false,
            journal_name: None,
        }
    }

    /// A new operation under the caller's key, such as one derived from its own order id.
    pub fn with_key(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            key_given: true,
            journal_name: None,
        }
    }

    /// The same operation, recorded in the client's journal as `name`: a caller that starts
    /// again and names it again resumes it under the key recorded on its first run, or gets
    /// its recorded answer.
    pub fn journaled(mut self, name: impl Into<String>) -> Self {
        self.journal_name = Some(name.into());
        self
    }

    /// The key this operation sends unless its journal entry holds another.
    pub fn key(&self) -> &str {
        &self.key
    }

    pub(crate) fn key_given(&self) -> bool {
        self.key_given
    }

    pub(crate) fn journal_name(&self) -> Option<&str> {
        self.journal_name.as_deref()
    }
}

impl Default for Operation {
    fn default() -> Self {
        Self::new()
    }
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This call's attempts executed the operation.
    Executed,
    /// The service replayed the answer stored under the key (`Idempotent-Replayed: true`): an
    /// earlier attempt, of this call or an earlier run, executed it.
    Replayed,
    /// The journal held the answer of an earlier run; nothing was sent.
    Journal,
}

/// A successful answer, and what the caller may want to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<T> {
    pub value: T,
    /// The HTTP status (`201` for a write).
    pub status: u16,
    /// The `Idempotency-Key` it was sent under (for a write).
    pub key: Option<String>,
    /// `Idempotency-Key-Expires`: until when the service replays this answer under the key
    /// (after it, the key is fresh).
    pub key_expires: Option<SystemTime>,
    pub origin: Origin,
    /// How many attempts it took (0 when the journal had it).
    pub attempts: u32,
}
