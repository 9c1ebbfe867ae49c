//! `file:///path/to/dir`: locks on **one host**, `flock(2)` on one file per
//! key under a directory, with fencing tokens from an fsynced counter
//! file. The kernel frees a lock when its holder process dies.
//!
//! # What it guarantees
//!
//! - **Mutual exclusion** between every holder on the host: other
//!   processes using this backend, other backend values in one process
//!   (each grant has its own open file description), and any program that
//!   takes `flock(2)` on the same file, shell scripts using util-linux
//!   `flock(1)` included: `flock /dir/jobs%2Fnightly.lock cmd` and this
//!   backend's `jobs/nightly` mutex exclude each other both ways.
//! - **Fencing tokens** strictly increasing per key (and shape), across
//!   processes, crashes and reboots: the counter file `<stem>.token` is
//!   read, incremented, written and fsynced while the lock is held, before
//!   the token is handed out (a new counter file's directory is fsynced
//!   too). On tmpfs the counters vanish at reboot: put the directory on a
//!   persistent file system if tokens must outlive one.
//! - **Read-write locks** (`flock` shared / exclusive), with writer
//!   preference through a gate file (see the `attempt` module): a waiting
//!   writer is not starved by overlapping readers. A read grant carries
//!   the token of the last write grant. A write grant **downgrades** to a
//!   read grant without a gap (the [`Downgrade`](lock_core::Downgrade)
//!   facet, its only facet): Linux converts a `flock` from exclusive to
//!   shared under the inode's lock list spinlock, so no other request is
//!   granted in between (tested against a `flock -x` blocked in the
//!   kernel; `flock(2)`'s man page does not promise it in general). No
//!   semaphores (refused with `Unsupported`).
//!
//! # The TTL model: per process
//!
//! A grant lasts as long as its open file description: until it is
//! released, until the [`FileBackend`] that took it is dropped (its last
//! clone), or until the holder process dies, when the kernel closes the
//! file and frees the lock at once, whatever the TTL. **The TTL frees
//! nothing**: a holder that stops renewing keeps the lock while its process
//! lives (its guard reports `Lost` at its validity deadline, which is the
//! safe side). A paused process (`SIGSTOP`) keeps its locks.
//! [`Capabilities::ttl_model`](lock_core::Capabilities::ttl_model) says
//! [`TtlModel::PerProcess`](lock_core::TtlModel::PerProcess).
//! A renewal sends nothing anywhere: it checks that the grant is still in
//! this backend and that its path still names the locked file (same device
//! and inode), and fails with `NotHeld` if the file was deleted or replaced.
//!
//! A lease handed to another process as a handle
//! ([`Lease::to_handle`](lock_core::Lease::to_handle)) means nothing there:
//! the lock is the holder process's open file.
//!
//! # Waiting
//!
//! Waiters poll with a non-blocking `flock` (1 ms doubling to 16 ms, with
//! jitter), on a blocking thread per attempt (the token's `fsync` blocks).
//! A blocked `flock(2)` could be interrupted only by a signal: a cancelled
//! waiter would keep its thread (a writer its gate) until the lock came
//! free. With polling, a dropped acquire leaves nothing at once, and a
//! waiting deadline is kept to the poll interval. Waiting is not FIFO.
//!
//! # Files and keys
//!
//! Key `k` of a mutex is the file `<dir>/<stem>.lock`, its counter
//! `<stem>.token`; a read-write lock uses `<stem>.rwlock`, `<stem>.rwtoken`
//! and `<stem>.rwgate`. The stem escapes every byte outside
//! `[A-Za-z0-9._-]` as `%XX`; see [`keys`] for the exact mapping. Files
//! are never deleted by the backend (deleting a lock file while it is held
//! would let a second holder lock a new file at the same path; renewals
//! detect it). The lock file holds the exclusive holder's record
//! (`owner token pid`), which `inspect` reports when `/proc/locks` shows
//! the file locked; a holder that is not this library is reported as
//! `pid <n>` without a token.
//!
//! # What it cannot do
//!
//! - **One host only.** `flock` over NFS is emulated with byte-range
//!   locks on some kernels and not at all on others, and a client that
//!   loses its lease keeps believing it holds the lock: never point this
//!   backend at a network file system. The URL's host must be empty or
//!   `localhost`.
//! - Linux: `inspect` reads `/proc/locks`.
//! - Each held grant keeps one file descriptor open (the process's
//!   `RLIMIT_NOFILE` bounds how many locks it can hold).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let dir = std::env::temp_dir();
//! let backend = lock_file::connect(&format!("file://{}", dir.display())).await?;
//! let client = lock_core::LockClient::new(backend);
//! let guard = client.lock("doc/example").acquire().await?;
//! println!("token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod config;
mod connection;
mod descriptor;
mod error;
mod files;
mod grants;
pub mod keys;

pub use backend::{CAPABILITIES, FileBackend, MAX_POLL};
pub use config::FileConfig;
pub use descriptor::DRIVER;
pub use lock_core::LockError;

/// The backend's name (and the facade's cargo feature).
pub const NAME: &str = "file";

/// Opens `file:///path/to/dir`.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for another scheme,
/// a host other than `localhost`, a relative path, an option, or a
/// directory that is missing, not a directory, or where files cannot be
/// created.
///
/// # Cancel safety
///
/// Safe: nothing is held until it returns.
pub async fn connect(url: &str) -> Result<FileBackend, LockError> {
    let config = FileConfig::from_url(url).map_err(|e| e.with_backend(NAME))?;
    FileBackend::new(config)
}

/// Opens the backend of a parsed URL, meeting `requirements` where the
/// driver has a setting for them (what the facade's `distlock::connect`
/// calls, through [`DRIVER`]).
///
/// # Errors
///
/// As [`connect`].
///
/// # Cancel safety
///
/// As [`connect`].
pub async fn open(
    endpoint: lock_core::endpoint::Endpoint,
    _requirements: lock_core::Requirements,
) -> Result<FileBackend, LockError> {
    let config = FileConfig::from_endpoint(endpoint).map_err(|e| e.with_backend(NAME))?;
    FileBackend::new(config)
}
