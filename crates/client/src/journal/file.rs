//! The caller's memory of its logical operations, so that a caller that crashes and starts
//! again resumes each one under the key it already sent, and never makes a second charge.
//!
//! An operation is recorded, with its request and its key, before its first send; its answer
//! is recorded when the service gives one it stores under the key (the answer carries
//! `Idempotency-Key-Expires`). A restarted caller that finds an operation with no answer sends
//! it again under the same key: the service finishes or replays what the first run started. One
//! that finds the answer has it without asking. [`FileJournal`] keeps the records in a file;
//! another store implements [`Journal`].

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

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

/// A journal in one file of JSON lines, appended to and flushed to disk (`fsync`) on every
/// record; the last line of a name wins. A line cut short by a crash is ignored. The file is
/// locked (`flock`) while it is open, so that two processes never resume one operation side
/// by side; the lock goes with the process, however it ends.
#[derive(Debug)]
pub struct FileJournal {
    path: PathBuf,
    state: Mutex<Opened>,
}

#[derive(Debug)]
struct Opened {
    file: File,
    entries: HashMap<String, JournalEntry>,
}

impl FileJournal {
    /// Opens the journal at `path`, creating it when missing; fails when another process has
    /// it open.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path = path.as_ref().to_path_buf();
        let error = |reason: &dyn std::fmt::Display| JournalError {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .map_err(|e| error(&e))?;
        file.try_lock()
            .map_err(|_| error(&"in use by another process"))?;
        let mut entries = HashMap::new();
        for line in BufReader::new(&file).lines() {
            let line = line.map_err(|e| error(&e))?;
            if let Ok(entry) = serde_json::from_str::<JournalEntry>(&line) {
                entries.insert(entry.name.clone(), entry);
            }
        }
        Ok(Self {
            path,
            state: Mutex::new(Opened { file, entries }),
        })
    }

    fn error(&self, reason: impl ToString) -> JournalError {
        JournalError {
            path: self.path.display().to_string(),
            reason: reason.to_string(),
        }
    }
}

impl Journal for FileJournal {
    fn entry(&self, name: &str) -> Result<Option<JournalEntry>, JournalError> {
        let state = self.state.lock().map_err(|_| self.error("poisoned"))?;
        Ok(state.entries.get(name).cloned())
    }

    fn record(&self, entry: &JournalEntry) -> Result<(), JournalError> {
        let mut state = self.state.lock().map_err(|_| self.error("poisoned"))?;
        let line = serde_json::to_string(entry).map_err(|error| self.error(error))?;
        // A line cut short by an earlier crash must not swallow this one: start it afresh.
        let written = state.file.write_all(format!("\n{line}\n").as_bytes());
        written
            .and_then(|()| state.file.sync_all())
            .map_err(|error| self.error(error))?;
        state.entries.insert(entry.name.clone(), entry.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, key: &str, answer: Option<RecordedAnswer>) -> JournalEntry {
        JournalEntry {
            name: name.to_owned(),
            request: "POST /charges sha256:00".to_owned(),
            key: key.to_owned(),
            answer,
        }
    }

    #[test]
    fn a_reopened_journal_has_every_operation_as_last_recorded() {
        let dir = std::env::temp_dir().join(format!("journal-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("journal");
        let answer = RecordedAnswer {
            status: 201,
            key_expires: "Tue, 01 Dec 2026 12:00:00 GMT".to_owned(),
            body: serde_json::json!({ "id": "ch_1" }),
        };
        {
            let journal = FileJournal::open(&path).expect("open");
            let taken = FileJournal::open(&path).expect_err("one process at a time");
            assert!(taken.to_string().contains("in use"), "{taken}");
            assert_eq!(journal.entry("order-1").expect("read"), None);
            journal
                .record(&entry("order-1", "k1", None))
                .expect("record");
            journal
                .record(&entry("order-2", "k2", None))
                .expect("record");
            let finished = entry("order-1", "k1", Some(answer.clone()));
            journal.record(&finished).expect("record");
        }
        // A crash in the middle of a line leaves half of it; the next record still lands.
        let mut file = OpenOptions::new().append(true).open(&path).expect("file");
        file.write_all(b"{\"name\":\"order-3\",\"requ")
            .expect("write");
        drop(file);
        let journal = FileJournal::open(&path).expect("reopen");
        journal
            .record(&entry("order-4", "k4", None))
            .expect("record");
        drop(journal);

        let journal = FileJournal::open(&path).expect("reopen");
        let first = journal.entry("order-1").expect("read").expect("order-1");
        assert_eq!(first.answer, Some(answer));
        let second = journal.entry("order-2").expect("read").expect("order-2");
        assert_eq!((second.key.as_str(), second.answer), ("k2", None));
        assert_eq!(journal.entry("order-3").expect("read"), None);
        assert!(journal.entry("order-4").expect("read").is_some());
        std::fs::remove_dir_all(dir).expect("clean up");
    }
}
