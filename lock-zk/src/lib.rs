//! The ZooKeeper driver of the distlock family: Curator's lock recipe
//! (ephemeral sequential nodes, lowest sequence holds, each waiter watches
//! its predecessor), with `czxid` fencing tokens and a session-aware lost
//! signal.
//!
//! ```no_run
//! # #[tokio::main]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let client = lock_core::LockClient::new(
//!     lock_zk::connect("zk://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/myapp?session_timeout=10s").await?,
//! );
//! let guard = client.lock("nightly-report").acquire().await?;
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # URL
//!
//! `zk://[user:password@]host:port[,host:port...][/chroot][?options]` (also
//! `zookeeper://`). Options: `session_timeout`, `connect_timeout`, `timeout`
//! (each request), `root` (lock root inside the chroot, default
//! `/distlock`), `containers` (`true`/`false`), `layout` (`escaped`, the
//! default, or `path`: a key is the absolute lock directory kazoo's `Lock`
//! and Curator's `InterProcessMutex` use), `nodes` (`curator`, the default,
//! or `kazoo`: our mutex nodes named as kazoo names its own). A user and
//! password turn on `digest` authentication. See [`ZkConfig`].
//!
//! # Guarantees
//!
//! - [x] Fencing tokens per key: the lock node's `czxid`, which only grows,
//!   across leader elections too.
//! - [x] Linearizable: writes go through the leader's quorum, and the reads
//!   that decide a grant or confirm a renewal follow a `sync`.
//! - [x] Waiting by a watch on the predecessor only, FIFO.
//! - [x] Session signal: `Disconnected` makes the guard `Suspect`, `Expired`
//!   makes it `Lost` at once.
//! - [x] Curator's layouts: its mutex, `InterProcessReadWriteLock`,
//!   `InterProcessSemaphoreV2` and `LeaderLatch` exclude with ours; kazoo's
//!   `Lock` too (see `layout` and `nodes`).
//! - [x] Ensembles, chroot, digest authentication; holder details, `list`,
//!   `force_release`, `gc`.
//! - [x] Writes guarded by the store: a check on a mutex lease's lock node
//!   first in your `multi`, on the backend's session
//!   ([`ZkBackend::guarded_multi`]) or any other ([`ZkOwnerCheck`]).
//!
//! # Caveats
//!
//! - **TTL model: per session.** A live holder's client deletes a node not
//!   renewed within its TTL, but a crashed holder's node lives until its
//!   session expires (the session timeout), not its TTL.
//! - A kazoo or Curator holder broken by `force_release` is not told (their
//!   locks do not watch their own node).
//! - A ZooKeeper server needs about 2 kB of heap per held lock.
//! - The `zookeeper-client` crate's socket keeps Nagle's algorithm on (it
//!   offers no `TCP_NODELAY`): requests the driver makes together (a
//!   create and the list behind it) may leave one round trip apart, so an
//!   acquire on a free key costs one or two round trips, not always one.
//!   Which it is stays fixed for a session: in 0.11.2 the crate's session
//!   task polls its request queue and its socket writer in an order set by
//!   the task's address in memory, and only one order in five takes both
//!   requests before writing them (measured: 2.0 or 3.0 round trips per
//!   acquire + release cycle, one or the other per session).
//!
//! The recipes, the other clients' layouts, elections, the operating calls
//! and how each is tested are described in depth in
//! `docs/backends/zookeeper.md` of the repository.

#![deny(missing_docs)]

mod admin;
mod backend;
mod cleanup;
mod config;
mod connection;
mod descriptor;
mod elections;
mod error;
mod expiry;
mod grants;
mod guarded;
pub mod keys;
mod renewal;
mod shared;
mod waiting;

pub use backend::{ZkBackend, capabilities};
pub use config::{DEFAULT_ROOT, MIN_TTL, ZkConfig, ZkLayout, ZkNodeNames};
pub use descriptor::DRIVER;
pub use guarded::{ZkGuardedOutcome, ZkOwnerCheck};
/// The ZooKeeper client library this driver speaks through, re-exported:
/// the version [`ZkOwnerCheck`] and [`ZkBackend::guarded_multi`] take.
pub use zookeeper_client;

use lock_core::LockError;

/// The URL schemes this driver accepts.
pub const URL_SCHEMES: &[&str] = &["zk", "zookeeper"];

/// Parses `url` (see [`ZkConfig::from_url`]) and connects.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL;
/// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) or
/// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when no session can
/// be opened within the connect timeout.
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn connect(url: &str) -> Result<ZkBackend, LockError> {
    ZkBackend::connect(ZkConfig::from_url(url)?).await
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
) -> Result<ZkBackend, LockError> {
    ZkBackend::connect(ZkConfig::from_endpoint(endpoint)?).await
}
