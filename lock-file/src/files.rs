//! The file operations of a grant, written with `std` only (no `unsafe`):
//! `flock(2)` through [`File::try_lock`] / [`File::try_lock_shared`], the
//! fsynced fencing counter, the holder record in the lock file, and what
//! `/proc/locks` says about a lock file.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// How often a lock that keeps being replaced under us is tried again
/// before giving up (someone deleting lock files in a loop).
const REPLACED_RETRIES: usize = 8;

/// Opens (creating it if needed) the file to lock. Read and write, so the
/// holder can write its record; `flock(1)` opens the same file read-only,
/// which does not matter to `flock(2)`.
fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// Tries once to lock `path` (shared or exclusive) without blocking:
/// `Ok(None)` when another open file description holds a conflicting
/// `flock`. The returned file holds the lock until it is unlocked or
/// closed.
///
/// After the lock is taken the path is checked to still name the locked
/// file: a lock file unlinked (or replaced) between our `open` and our
/// `flock` would otherwise give us a lock nobody else can see.
pub(crate) fn try_lock_path(path: &Path, shared: bool) -> io::Result<Option<File>> {
    for _ in 0..REPLACED_RETRIES {
        let file = open_lock_file(path)?;
        let taken = if shared {
            file.try_lock_shared()
        } else {
            file.try_lock()
        };
        match taken {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(e),
        }
        if names_file(path, &file)? {
            return Ok(Some(file));
        }
        // Closing the file drops the lock on the orphaned inode.
    }
    Err(io::Error::other(format!(
        "{} keeps being replaced while it is locked: something deletes lock files",
        path.display()
    )))
}

/// Whether `path` still names the open `file` (same device and inode).
/// `false` when the path is gone.
pub(crate) fn names_file(path: &Path, file: &File) -> io::Result<bool> {
    let ours = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(now.dev() == ours.dev() && now.ino() == ours.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads the counter file's value: 0 when the file is missing or empty
/// (no grant yet).
///
/// # Errors
///
/// I/O errors; `InvalidData` for a counter that is not a number (never
/// reset silently: tokens would go backwards).
pub(crate) fn read_token(path: &Path) -> io::Result<u64> {
    match File::open(path) {
        Ok(mut file) => parse_token(path, &read_all(&mut file)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

fn read_all(file: &mut File) -> io::Result<String> {
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

fn parse_token(path: &Path, text: &str) -> io::Result<u64> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    text.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "fencing counter {} holds {text:?}, not a number",
                path.display()
            ),
        )
    })
}

/// The fencing counter of a key, open while its exclusive lock is held.
#[derive(Debug)]
pub(crate) struct Counter<'a> {
    path: &'a Path,
    file: File,
    /// The value read: the last token granted (0: none yet).
    pub(crate) current: u64,
}

impl<'a> Counter<'a> {
    /// Opens (creating it if needed) and reads the counter at `path`; the
    /// caller holds the key's exclusive lock.
    pub(crate) fn open(path: &'a Path) -> io::Result<Self> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let current = parse_token(path, &read_all(&mut file)?)?;
        Ok(Self {
            path,
            file,
            current,
        })
    }

    /// The token after [`current`](Self::current).
    pub(crate) fn next(&self) -> io::Result<u64> {
        self.current.checked_add(1).ok_or_else(|| {
            io::Error::other(format!(
                "fencing counter {} is exhausted",
                self.path.display()
            ))
        })
    }

    /// Writes `next` and fsyncs it before the token is handed out, so
    /// tokens strictly increase across processes, crashes and restarts. A
    /// counter file created now is made durable too (its directory is
    /// fsynced), so a crash cannot lose it and restart the tokens.
    pub(crate) fn store(self, next: u64) -> io::Result<()> {
        let text = format!("{next}\n");
        self.file.write_all_at(text.as_bytes(), 0)?;
        // The value only grows, so its text never gets shorter; cut
        // anything after it anyway (a hand-edited file).
        let len = u64::try_from(text.len()).unwrap_or(u64::MAX);
        self.file.set_len(len)?;
        self.file.sync_data()?;
        if self.current == 0
            && let Some(dir) = self.path.parent()
        {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// The next fencing token of a key, stored (see [`Counter::store`]); the
/// caller holds the key's exclusive lock.
#[cfg(test)]
pub(crate) fn next_token(path: &Path) -> io::Result<u64> {
    let counter = Counter::open(path)?;
    let next = counter.next()?;
    counter.store(next)?;
    Ok(next)
}

/// What an exclusive holder writes into its lock file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// The grant's owner id in hex.
    pub(crate) owner: String,
    /// Its fencing token.
    pub(crate) token: u64,
    /// The holding process (what `/proc/locks` shows for the lock).
    pub(crate) pid: u32,
}

impl Record {
    /// Writes this record over the lock file's contents. Not fsynced: it
    /// only serves `inspect`, and is meaningless once the lock is free.
    pub(crate) fn write(&self, file: &File) -> io::Result<()> {
        file.set_len(0)?;
        let text = format!("{} {} {}\n", self.owner, self.token, self.pid);
        file.write_all_at(text.as_bytes(), 0)
    }

    /// The record in the lock file at `path`, if one parses (a holder that
    /// is not this library, such as `flock(1)`, writes none, and a
    /// `exec 9>file` in a shell truncates it).
    pub(crate) fn read(path: &Path) -> io::Result<Option<Self>> {
        let text = match File::open(path) {
            Ok(mut file) => read_all(&mut file)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut parts = text.split_whitespace();
        let parsed = (|| {
            let owner = parts.next()?.to_owned();
            let token = parts.next()?.parse().ok()?;
            let pid = parts.next()?.parse().ok()?;
            Some(Self { owner, token, pid })
        })();
        Ok(parsed)
    }
}

/// One `flock` held on a file, as `/proc/locks` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlockHolder {
    /// The process that took it.
    pub(crate) pid: u32,
    /// `LOCK_EX` (`WRITE`) rather than `LOCK_SH` (`READ`).
    pub(crate) exclusive: bool,
}

/// The `flock`s held (not waited for) on the file at `path` right now;
/// empty when the file does not exist. Read from `/proc/locks`, so looking
/// never takes the lock, not even for a moment.
pub(crate) fn flock_holders(path: &Path) -> io::Result<Vec<FlockHolder>> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let table = std::fs::read_to_string("/proc/locks")?;
    Ok(parse_proc_locks(&table, meta.dev(), meta.ino()))
}

/// The device as `/proc/locks` writes it: `major:minor` in hex (the Linux
/// `dev_t` encoding of glibc's `major()` / `minor()`).
fn dev_parts(dev: u64) -> (u64, u64) {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
    (major, minor)
}

fn parse_proc_locks(table: &str, dev: u64, ino: u64) -> Vec<FlockHolder> {
    let (major, minor) = dev_parts(dev);
    table
        .lines()
        .filter_map(|line| {
            // `1: FLOCK  ADVISORY  WRITE 4567 fe:00:1234 0 EOF`; a waiter's
            // line has `->` after the number and is skipped.
            let mut fields = line.split_whitespace().skip(1);
            if fields.next()? != "FLOCK" {
                return None;
            }
            let _advisory = fields.next()?;
            let exclusive = match fields.next()? {
                "WRITE" => true,
                "READ" => false,
                _ => return None,
            };
            let pid = fields.next()?.parse().ok()?;
            let mut id = fields.next()?.split(':');
            let file_major = u64::from_str_radix(id.next()?, 16).ok()?;
            let file_minor = u64::from_str_radix(id.next()?, 16).ok()?;
            let file_ino: u64 = id.next()?.parse().ok()?;
            (file_major == major && file_minor == minor && file_ino == ino)
                .then_some(FlockHolder { pid, exclusive })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_lines_are_read_for_one_file_only() {
        let table = "1: FLOCK  ADVISORY  WRITE 4567 fe:00:1234 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 4568 fe:00:1234 0 EOF\n\
                     2: FLOCK  ADVISORY  READ 17 fe:00:99 0 EOF\n\
                     3: POSIX  ADVISORY  WRITE 18 fe:00:1234 0 EOF\n\
                     4: FLOCK  ADVISORY  READ 19 fe:01:1234 0 EOF\n";
        let dev = 0xfe << 8;
        assert_eq!(
            parse_proc_locks(table, dev, 1234),
            [FlockHolder {
                pid: 4567,
                exclusive: true
            }]
        );
        assert_eq!(parse_proc_locks(table, dev, 99).len(), 1);
        assert_eq!(dev_parts(dev), (0xfe, 0));
    }

    #[test]
    fn our_own_flock_shows_in_proc_locks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let held = try_lock_path(&path, false).unwrap().expect("free");
        let seen = flock_holders(&path).unwrap();
        assert_eq!(
            seen,
            [FlockHolder {
                pid: std::process::id(),
                exclusive: true
            }]
        );
        assert!(try_lock_path(&path, true).unwrap().is_none());
        drop(held);
        assert!(flock_holders(&path).unwrap().is_empty());
    }

    #[test]
    fn counters_rise_and_refuse_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.token");
        assert_eq!(read_token(&path).unwrap(), 0);
        assert_eq!(next_token(&path).unwrap(), 1);
        assert_eq!(next_token(&path).unwrap(), 2);
        assert_eq!(read_token(&path).unwrap(), 2);
        std::fs::write(&path, "x").unwrap();
        assert_eq!(
            next_token(&path).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
