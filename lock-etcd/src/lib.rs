//! The etcd driver of the distlock family: leases, revisions as fencing
//! tokens, FIFO waits, and the same layout as `etcdctl lock`.
//!
//! ```no_run
//! # async fn example() -> Result<(), lock_core::LockError> {
//! use lock_core::LockClient;
//!
//! let backend = lock_etcd::connect("etcd://127.0.0.1:2379/locks?ttl=10s").await?;
//! let client = LockClient::new(backend);
//! let guard = client.lock("nightly-report").acquire().await?;
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # URLs
//!
//! `etcd://[user[:password]@]host:port[,host:port...][/prefix][?options]`,
//! and `etcds://` for TLS. Options: `ttl` (default session TTL, e.g. `10s`),
//! `timeout` (per call), `connect_timeout`, `user`, `password`, and for TLS
//! `ca`, `cert`, `key` (PEM file paths) and `domain`. See
//! [`EtcdConfig::from_url`].
//!
//! # Guarantees
//!
//! - [x] Fencing tokens: the lock entry's create revision, global and
//!   strictly increasing, kept across leader changes and restarts
//!   ([`FencingScope::Global`](lock_core::FencingScope::Global), survives
//!   failover).
//! - [x] Linearizable (CP): grants go through raft.
//! - [x] Waiting by a watch on the predecessor only, FIFO.
//! - [x] The layout of `etcdctl lock` and Go's `concurrency.Mutex`
//!   (`<prefix>/<key>/<lease hex>`, lowest create revision holds), so they
//!   and this crate exclude each other; elections in `etcdctl elect`'s
//!   layout.
//! - [x] Per-lock TTL on one shared session lease: holding many locks costs
//!   one keep-alive; a lock not renewed within its own TTL is deleted by the
//!   client that granted it.
//! - [x] Read-write locks, semaphores, multi-locks of up to 128 keys in one
//!   transaction; holder details, `list`, `force_release`.
//! - [x] Writes guarded by the store: data in the same etcd written in a
//!   transaction that compares the lock's entry, as Go's `IsOwner()`
//!   ([`EtcdBackend::owner_compares`], [`EtcdBackend::guarded_txn`]); the
//!   write lands only if the lease still holds the key at the commit.
//! - [x] Several endpoints (calls spread over the members that answer; a
//!   member cut off from its peers is left until it answers again), TLS,
//!   user/password authentication.
//!
//! # Caveats
//!
//! - If the holder's process dies or is cut off, the **session lease** frees
//!   its locks: within the TTL rounded **up** to whole seconds. The minimum
//!   TTL is 1 s.
//! - If the session lease is lost, every lock on it is lost at once.
//! - An entry deleted behind the holder's back (`force_release`,
//!   `etcdctl del`) is noticed at its next renewal, not before.
//! - Dropping the backend stops the keep-alive without revoking (locks free
//!   after the TTL); [`EtcdBackend::close`] frees everything at once.
//!
//! The layout, the TTL model, elections, the operating calls and how each is
//! tested are described in depth in `docs/backends/etcd.md` of the
//! repository.

#![deny(missing_docs)]

// The pieces every component uses.
mod config;
mod connection;
mod descriptor;
mod error;
pub mod keys;

// The components, each owning one concern, and the backend made of them.
mod admin;
mod backend;
mod elections;
mod grants;
mod guarded;
mod renewal;
mod sets;
mod shared;
mod waiting;

pub use backend::{EtcdBackend, capabilities};
pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_TTL, EtcdConfig, EtcdTls, MIN_TTL,
};
pub use descriptor::DRIVER;
pub use guarded::EtcdGuardedOutcome;

/// The etcd client this crate speaks through, for the types of its API
/// ([`EtcdBackend::client`], the compares of
/// [`EtcdBackend::owner_compares`]) at the same version.
pub use etcd_client;

use lock_core::LockError;

/// The URL schemes this crate accepts: `etcd` and `etcds` (TLS).
pub const URL_SCHEMES: &[&str] = &["etcd", "etcds"];

/// Parses `url` (see [`EtcdConfig::from_url`]) and connects.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL or
/// rejected credentials; [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable)
/// or [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when etcd cannot
/// be reached in time.
///
/// # Cancel safety
///
/// Dropping the future may leave a granted session lease behind; it expires
/// with its TTL.
pub async fn connect(url: &str) -> Result<EtcdBackend, LockError> {
    EtcdBackend::connect(EtcdConfig::from_url(url)?).await
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
) -> Result<EtcdBackend, LockError> {
    EtcdBackend::connect(EtcdConfig::from_endpoint(endpoint)?).await
}
