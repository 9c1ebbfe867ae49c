//! The grants one backend value holds: each an open lock file, which *is*
//! the lock (the kernel keeps a `flock` as long as its open file
//! description lives). The table is the backend's session: dropping the
//! last clone of the backend closes every file and frees every lock, and
//! the holder process's death does the same in the kernel.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use lock_core::{Lease, LeaseKind, LockKey, OwnerId};

use crate::files::names_file;

/// One held grant.
#[derive(Debug)]
struct Held {
    key: LockKey,
    kind: LeaseKind,
    /// The locked file's path, to check that it still names our file.
    path: PathBuf,
    file: File,
}

/// Whether a held grant is still what its lease says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Ours, and the path still names the locked file.
    Held,
    /// Not in this session (released, never ours, another backend's).
    Unknown,
    /// Ours, but the lock file was deleted or replaced: others can lock
    /// the new file at that path, so the grant protects nothing any more.
    Replaced,
}

/// The held grants, by owner id.
#[derive(Debug, Default)]
pub(crate) struct Session {
    held: Mutex<HashMap<OwnerId, Held>>,
}

impl Session {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerId, Held>> {
        // A panic elsewhere while the table was locked leaves it usable:
        // every entry is complete or absent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `file` as the grant of `owner`.
    pub(crate) fn insert(
        &self,
        owner: OwnerId,
        key: LockKey,
        kind: LeaseKind,
        path: PathBuf,
        file: File,
    ) {
        self.table().insert(
            owner,
            Held {
                key,
                kind,
                path,
                file,
            },
        );
    }

    /// Where `lease` stands: no I/O but two `stat`s.
    pub(crate) fn standing(&self, lease: &Lease) -> Standing {
        let table = self.table();
        let Some(held) = table
            .get(&lease.owner())
            .filter(|h| h.key == *lease.key() && h.kind == lease.kind())
        else {
            return Standing::Unknown;
        };
        match names_file(&held.path, &held.file) {
            Ok(true) => Standing::Held,
            // A path we cannot even look at no longer shows our lock to
            // anyone.
            _ => Standing::Replaced,
        }
    }

    /// Takes `lease`'s grant out of the session and unlocks it; what it
    /// stood at before.
    pub(crate) fn release(&self, lease: &Lease) -> Standing {
        let held = {
            let mut table = self.table();
            match table.get(&lease.owner()) {
                Some(h) if h.key == *lease.key() && h.kind == lease.kind() => {
                    table.remove(&lease.owner())
                }
                _ => None,
            }
        };
        let Some(held) = held else {
            return Standing::Unknown;
        };
        let standing = match names_file(&held.path, &held.file) {
            Ok(true) => Standing::Held,
            _ => Standing::Replaced,
        };
        if held.kind != LeaseKind::Read {
            // The record names a holder that is leaving. Best effort: the
            // lock is what counts, and `inspect` reads a record only while
            // the file is locked.
            let _ = held.file.set_len(0);
        }
        // Explicitly, not only by closing: a child forked at this moment
        // shares the open file description until it execs, and must not
        // keep the lock alive.
        let _ = held.file.unlock();
        standing
    }

    /// Turns `lease`'s write grant into a read grant of the same file:
    /// `flock(LOCK_SH)` on the file that holds `LOCK_EX`. Linux converts
    /// it under the inode's lock spinlock, removing the exclusive lock and
    /// inserting the shared one in one step, so no other `flock` request
    /// is granted in between (the man page's warning that a conversion
    /// "is not guaranteed to be atomic" is about other systems and old
    /// kernels). `Ok(false)`: not a write grant held here.
    pub(crate) fn downgrade(&self, lease: &Lease) -> std::io::Result<bool> {
        let mut table = self.table();
        let Some(held) = table
            .get_mut(&lease.owner())
            .filter(|h| h.key == *lease.key() && h.kind == LeaseKind::Write)
        else {
            return Ok(false);
        };
        if !names_file(&held.path, &held.file)? {
            return Ok(false);
        }
        match held.file.try_lock_shared() {
            Ok(()) => {}
            // Nobody else can hold the file while we hold it exclusively.
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(std::io::Error::other(
                    "the kernel refused to convert our exclusive flock",
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        held.kind = LeaseKind::Read;
        // Readers keep no record; a stale one would only delay `inspect`.
        let _ = held.file.set_len(0);
        Ok(true)
    }

    /// How many grants are held (for tests and `Debug`).
    pub(crate) fn len(&self) -> usize {
        self.table().len()
    }
}
