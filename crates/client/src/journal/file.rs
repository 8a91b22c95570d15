//! [`FileJournal`]: the journal in a file of its own, private to its user and durable.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{Journal, JournalEntry, JournalError};

/// A journal in one file of JSON lines, appended to and flushed to disk (`fsync`) on every
/// record; the last line of a name wins. A line cut short by a crash is ignored. The file is
/// locked (`flock`) while it is open, so that two processes never resume one operation side
/// by side; the lock goes with the process, however it ends.
///
/// The file holds keys and answers, so it is its user's alone: created with mode 0600 (an
/// existing one readable by others is made so), and opened only as a file of its own, never
/// through a symbolic link (`O_NOFOLLOW`), which another user could point elsewhere. Its
/// directory is flushed to disk when the file is created, so that the file, and with it the
/// first key, outlives a power loss.
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
    /// it open, or when `path` is a symbolic link or not a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let path = path.as_ref().to_path_buf();
        let error = |reason: &dyn std::fmt::Display| JournalError {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        let file = open_private(&path).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => error(
                &"is a symbolic link: a journal is opened only as a file of its own, never \
                  through a link",
            ),
            _ => error(&e),
        })?;
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

/// The file at `path`, opened to read and append without following a symbolic link, and
/// private: created 0600 (its directory flushed after), or made 0600 when it is wider.
fn open_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW);
    let file = loop {
        match options.open(path) {
            Ok(file) => break file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        // O_EXCL: never through a link either, and never a file another process just made.
        match options.clone().create_new(true).open(path) {
            Ok(file) => {
                sync_directory_of(path)?;
                break file;
            }
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(error),
        }
    };
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(io::Error::other("not a file"));
    }
    if metadata.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// Flushes the directory that holds `path` to disk: a new file's name is in its directory, and
/// a file created and synced whose directory was not can be gone after a power loss.
fn sync_directory_of(path: &Path) -> io::Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(directory)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::RecordedAnswer;

    fn entry(name: &str, key: &str, answer: Option<RecordedAnswer>) -> JournalEntry {
        JournalEntry {
            name: name.to_owned(),
            request: "POST /charges sha256:00".to_owned(),
            key: key.to_owned(),
            base_url: "http://127.0.0.1:8080/".to_owned(),
            api_key_fingerprint: crate::journal::api_key_fingerprint("sk_test_acme"),
            recorded_at: Some(1_780_000_000),
            key_retention_secs: Some(86_400),
            answer,
        }
    }

    fn temporary_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("journal-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn a_reopened_journal_has_every_operation_as_last_recorded() {
        let dir = temporary_dir();
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

    #[test]
    fn the_journal_is_its_user_s_alone_and_never_opened_through_a_link() {
        let dir = temporary_dir();
        let path = dir.join("journal");
        drop(FileJournal::open(&path).expect("create"));
        let mode = |path: &Path| {
            let metadata = std::fs::symlink_metadata(path).expect("metadata");
            metadata.permissions().mode() & 0o777
        };
        assert_eq!(mode(&path), 0o600, "created private, whatever the umask");
        // One left readable by others is made private.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        drop(FileJournal::open(&path).expect("reopen"));
        assert_eq!(mode(&path), 0o600);

        // A link in its place, to a file or to nothing, is refused and left as it is.
        let target = dir.join("elsewhere");
        std::fs::write(&target, "").expect("target");
        for pointed in [&target, &dir.join("nothing")] {
            let link = dir.join("link");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(pointed, &link).expect("symlink");
            let refused = FileJournal::open(&link).expect_err("a link");
            assert!(refused.to_string().contains("symbolic link"), "{refused}");
        }
        assert_eq!(std::fs::read(&target).expect("target"), b"");
        assert!(!dir.join("nothing").exists());
        let refused = FileJournal::open(&dir).expect_err("a directory");
        assert!(
            refused.to_string().contains(dir.to_str().expect("utf-8")),
            "{refused}"
        );
        std::fs::remove_dir_all(dir).expect("clean up");
    }
}
