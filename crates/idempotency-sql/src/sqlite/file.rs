//! The database file: its directory created, and readable by its owner only.

use std::path::Path;

use crate::error::Error;

pub(super) fn create_parent_directory(file: &Path) -> Result<(), Error> {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir).map_err(|e| {
            Error::Unusable(format!("cannot create directory {}: {e}", dir.display()))
        }),
        _ => Ok(()),
    }
}

/// Creates the database file readable and writable by its owner only (0600), or narrows an
/// existing one to that: it holds stored responses and request bodies. SQLite gives the `-wal`
/// and `-shm` files the permissions of the database file; existing ones are narrowed too.
#[cfg(unix)]
pub(super) fn owner_only(file: &Path) -> Result<(), Error> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    const OWNER_ONLY: u32 = 0o600;
    let unusable = |path: &Path, e: std::io::Error| {
        Error::Unusable(format!(
            "cannot restrict {} to its owner: {e}",
            path.display()
        ))
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(OWNER_ONLY)
        .open(file)
        .map_err(|e| unusable(file, e))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut path = file.as_os_str().to_owned();
        path.push(suffix);
        let path = Path::new(&path);
        let Ok(metadata) = std::fs::metadata(path) else {
            continue;
        };
        if metadata.permissions().mode() & 0o077 != 0 {
            tracing::warn!(file = %path.display(), "narrowing the database file's permissions to 0600");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(OWNER_ONLY))
                .map_err(|e| unusable(path, e))?;
        }
    }
    Ok(())
}

#[cfg(not(unix))]
pub(super) fn owner_only(_file: &Path) -> Result<(), Error> {
    Ok(())
}
