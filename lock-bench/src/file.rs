//! The raw floor of the file backend: one grant and release of a mutex
//! written by hand with `std`, not through the driver.
//!
//! [`FileFloor`] takes the lock the driver takes (the same files, from the
//! driver's public `paths` module, so the floor's grants exclude the
//! driver's and `flock(1)`'s on the same key) with the same system calls,
//! inline on the calling task (no blocking thread per attempt, no session
//! table, no lease):
//!
//! 1. `open(O_RDWR|O_CREAT)` of `<stem>.lock`, `flock(LOCK_EX|LOCK_NB)`,
//!    and a `stat` of the path to check it still names the locked file;
//! 2. the fencing counter `<stem>.token`: open, read, write the next
//!    value, `fdatasync`;
//! 3. the holder record in the lock file (`ftruncate`, `pwrite`);
//! 4. the release: `ftruncate` of the record, `flock(LOCK_UN)`, `close`.
//!
//! There is no server: a cycle has no round trip. The cost is the system
//! calls and the counter's `fdatasync`, which dominates on a disk.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl};
use lock_file::FileConfig;
use lock_file::keys::KeyFiles;

// The driver's hook in `crate::for_driver`.
crate::floor_fn!(pub(crate) fn floor = FileFloor::connect);

/// A hand-written flock grant and release (see the module docs).
#[derive(Debug)]
pub struct FileFloor {
    dir: PathBuf,
    owner: String,
    /// The locked files of the grants not yet released, by lock path.
    held: Mutex<HashMap<PathBuf, File>>,
}

fn io_error(operation: Operation, error: std::io::Error) -> LockError {
    LockError::new(ErrorKind::Backend, operation, "file floor")
        .with_backend(lock_file::NAME)
        .with_source(error)
}

impl FileFloor {
    /// A floor on the directory of `file:///path/to/dir`.
    ///
    /// # Errors
    ///
    /// As [`lock_file::connect`]: `Config` for a bad URL or directory.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = FileConfig::from_url(url)?;
        config.check()?;
        Ok(Self {
            dir: config.dir().to_owned(),
            owner: OwnerId::random().to_hex(),
            held: Mutex::default(),
        })
    }

    fn grant(files: &KeyFiles, owner: &str) -> std::io::Result<Option<(File, u64)>> {
        let op = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
        };
        let file = op(&files.lock)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(e),
        }
        let (ours, now) = (file.metadata()?, std::fs::metadata(&files.lock)?);
        if (ours.dev(), ours.ino()) != (now.dev(), now.ino()) {
            return Ok(None);
        }
        let mut counter = op(&files.token)?;
        let mut text = String::new();
        counter.read_to_string(&mut text)?;
        let token = text.trim().parse::<u64>().unwrap_or(0) + 1;
        let text = format!("{token}\n");
        counter.write_all_at(text.as_bytes(), 0)?;
        counter.sync_data()?;
        file.set_len(0)?;
        let record = format!("{owner} {token} {}\n", std::process::id());
        file.write_all_at(record.as_bytes(), 0)?;
        Ok(Some((file, token)))
    }
}

#[async_trait]
impl RawFloor for FileFloor {
    fn name(&self) -> &'static str {
        lock_file::NAME
    }

    /// No server: nothing crosses a network.
    fn round_trips_per_cycle(&self) -> u32 {
        0
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        check_ttl(ttl, lock_file::CAPABILITIES.min_ttl, Operation::TryAcquire)?;
        let key = LockKey::new(key)?;
        let files = KeyFiles::mutex(&self.dir, &key);
        let Some((file, token)) =
            Self::grant(&files, &self.owner).map_err(|e| io_error(Operation::TryAcquire, e))?
        else {
            return Ok(None);
        };
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(files.lock.clone(), file);
        Ok(Some(FloorGrant {
            key: key.as_str().to_owned(),
            owner: self.owner.clone(),
            token,
            handle: files.lock.display().to_string(),
        }))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let file = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(Path::new(&grant.handle));
        let Some(file) = file else {
            return Ok(false);
        };
        file.set_len(0)
            .and_then(|()| file.unlock())
            .map_err(|e| io_error(Operation::Release, e))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::{LockBackend, LockBackendExt};

    /// The floor takes the driver's lock: each excludes the other, and
    /// they share the fencing counter.
    #[tokio::test]
    async fn the_floor_and_the_driver_take_the_same_lock() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let floor = FileFloor::connect(&url).await.unwrap();
        let driver = lock_file::connect(&url).await.unwrap();
        let ttl = Duration::from_secs(5);
        let key = LockKey::new("floor").unwrap();
        let grant = floor.try_grant("floor", ttl).await.unwrap().expect("free");
        assert_eq!(grant.token, 1);
        assert!(driver.try_acquire(&key, ttl).await.unwrap().is_none());
        assert!(floor.release(&grant).await.unwrap());
        let lease = driver.try_acquire(&key, ttl).await.unwrap().expect("free");
        assert_eq!(lease.token().get(), 2);
        assert!(floor.try_grant("floor", ttl).await.unwrap().is_none());
        assert!(driver.release(&lease).await.unwrap());
        floor.cycle("floor", ttl).await.unwrap();
        assert_eq!(floor.name(), driver.name());
        assert!(FileFloor::connect("file://relative").await.is_err());
    }
}
