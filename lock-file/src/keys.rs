//! How a [`LockKey`] becomes file names under the lock directory, shared by
//! the driver and the benchmark floor so that both take the same lock (and
//! so that a shell script can name the file `flock(1)` should lock).
//!
//! # The mapping
//!
//! The key's *stem* is its UTF-8 bytes with every byte outside
//! `[A-Za-z0-9._-]` written as `%XX` (upper-case hex), `%` itself included:
//! `jobs/nightly run` becomes `jobs%2Fnightly%20run`. The mapping is
//! injective (a stem decodes back to one key), never produces `/`, and a
//! stem is never `.` or `..` once its suffix is added. A stem longer than
//! [`MAX_PLAIN_STEM`] bytes (a long key of mostly escaped bytes) is cut to
//! that length and followed by `~` and the 32 hex digits of the key's
//! 128-bit FNV-1a hash (`~` is always escaped in the plain part, so such a
//! stem never equals a plain one), keeping every name under the 255-byte
//! limit of Linux file systems.
//!
//! Each shape has its own files (a mutex and a read-write lock of the same
//! key are different locks, as on every backend):
//!
//! | shape | locked with `flock` | fencing counter | writer gate |
//! |---|---|---|---|
//! | mutex | `<stem>.lock` | `<stem>.token` | - |
//! | read-write lock | `<stem>.rwlock` | `<stem>.rwtoken` | `<stem>.rwgate` |
//!
//! No suffix is the end of another suffix preceded by anything a stem can
//! end with, so the files of different keys and shapes never collide
//! (`a.rw` + `.lock` is `a.rw.lock`, never `a` + `.rwlock`).
//!
//! A shell script takes the same mutex as this backend with
//! `flock <dir>/<stem>.lock <command>`.

use std::path::{Path, PathBuf};

use lock_core::{LockKey, LockShape};

/// The longest stem written out in full; longer ones end with a hash.
pub const MAX_PLAIN_STEM: usize = 200;

/// The file-name stem of `key` (see the module docs).
pub fn stem(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for &byte in key.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    if out.len() > MAX_PLAIN_STEM {
        // Escapes are ASCII, so any byte index is a char boundary.
        out.truncate(MAX_PLAIN_STEM);
        out.push_str(&format!("~{:032x}", fnv1a_128(key.as_bytes())));
    }
    out
}

/// FNV-1a, 128 bits: stable across releases and platforms (the file names
/// of a key must never change), and enough against accidental collisions
/// of long keys. A collision would only make two keys share one lock.
fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes.iter().fold(OFFSET, |hash, &byte| {
        (hash ^ u128::from(byte)).wrapping_mul(PRIME)
    })
}

/// The files of one key in one shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFiles {
    /// The file locked with `flock(2)`; it also holds the current
    /// exclusive holder's record (owner, token, process id).
    pub lock: PathBuf,
    /// The fencing counter: the last token granted, in decimal.
    pub token: PathBuf,
    /// The read-write lock's writer gate (see `driver`); `None` for a
    /// mutex.
    pub gate: Option<PathBuf>,
}

impl KeyFiles {
    /// The files of `key` in `shape` under `dir`; `None` for a shape this
    /// backend does not have (semaphores).
    pub fn new(dir: &Path, key: &LockKey, shape: LockShape) -> Option<Self> {
        let stem = stem(key.as_str());
        let named = |suffix: &str| dir.join(format!("{stem}{suffix}"));
        match shape {
            LockShape::Mutex => Some(Self {
                lock: named(".lock"),
                token: named(".token"),
                gate: None,
            }),
            LockShape::ReadWrite => Some(Self {
                lock: named(".rwlock"),
                token: named(".rwtoken"),
                gate: Some(named(".rwgate")),
            }),
            _ => None,
        }
    }

    /// The mutex files of `key` under `dir`.
    pub fn mutex(dir: &Path, key: &LockKey) -> Self {
        let stem = stem(key.as_str());
        Self {
            lock: dir.join(format!("{stem}.lock")),
            token: dir.join(format!("{stem}.token")),
            gate: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_are_safe_and_distinct() {
        assert_eq!(stem("jobs/nightly run"), "jobs%2Fnightly%20run");
        assert_eq!(stem("a.b_c-D9"), "a.b_c-D9");
        assert_eq!(stem("%"), "%25");
        assert_eq!(stem("é"), "%C3%A9");
        assert_ne!(stem("a/b"), stem("a%2Fb"));
        for key in ["/", "..", "a/../b", "~", "x\u{7f}"] {
            let s = stem(key);
            assert!(!s.contains('/'), "{key}: {s}");
            assert!(
                s.len() + ".lock".len() > 2,
                "never `.` or `..` with a suffix"
            );
        }
    }

    #[test]
    fn long_keys_end_with_a_hash_and_fit_a_file_name() {
        let long = "/".repeat(lock_core::MAX_KEY_LEN);
        let other = format!("{}x", "/".repeat(lock_core::MAX_KEY_LEN - 1));
        let (a, b) = (stem(&long), stem(&other));
        assert_ne!(a, b);
        assert!(a.len() + ".rwtoken".len() <= 255, "{}", a.len());
        assert!(a.contains('~'));
        assert_eq!(a, stem(&long), "stable");
    }

    #[test]
    fn shapes_have_their_own_files() {
        let dir = Path::new("/d");
        let key = LockKey::new("a").unwrap();
        let mutex = KeyFiles::new(dir, &key, LockShape::Mutex).unwrap();
        let rw = KeyFiles::new(dir, &key, LockShape::ReadWrite).unwrap();
        assert_eq!(mutex, KeyFiles::mutex(dir, &key));
        assert_eq!(mutex.lock, Path::new("/d/a.lock"));
        assert_eq!(rw.lock, Path::new("/d/a.rwlock"));
        let dotted = KeyFiles::mutex(dir, &LockKey::new("a.rw").unwrap());
        assert_ne!(dotted.lock, rw.lock);
        assert!(KeyFiles::new(dir, &key, LockShape::Semaphore).is_none());
    }
}
