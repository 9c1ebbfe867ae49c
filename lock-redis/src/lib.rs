//! The Redis driver of the distlock family: one server, a Sentinel-managed
//! master, Redis Cluster, or Redlock over independent servers.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_core::LockClient;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let backend = lock_redis::connect("redis://127.0.0.1:6379?ttl=10s").await?;
//! let client = LockClient::new(backend);
//! let total = client.with_lock("ledger", async { 40 + 2 }).await?;
//! # let _ = total; Ok(()) }
//! ```
//!
//! A whole program (a URL from the environment, a TTL and a wait, the
//! fencing token, the lost signal, the release) is `examples/redis_lock.rs`.
//!
//! # URLs
//!
//! | scheme | topology |
//! |---|---|
//! | `redis://[[user]:pw@]host[:port][/db]` | one server |
//! | `rediss://...` | one server over TLS |
//! | `redis+sentinel://[[user]:pw@]s1[:port][,s2...]/master[/db]` | master found through Sentinel |
//! | `redis+cluster://[[user]:pw@]n1[:port][,n2...]` | Redis Cluster (seed nodes) |
//! | `redlock://[[user]:pw@]n1[:port],n2[:port],n3[:port][/db]` | Redlock over independent servers |
//!
//! Query options: `ttl`, `prefix`, `timeout`, `recheck`, `replicas` and
//! `wait_timeout` (`WAIT` after each grant), `fair=true` (FIFO mutexes),
//! `layout=native|plain|redisson` and `token_suffix` (other libraries' key
//! layouts), `eviction=warn|refuse`, `sentinel_password`, and for TLS `tls`,
//! `ca=/path/ca.pem` and `insecure=true` (no verification at all; test setups
//! only). See [`RedisConfig`].
//!
//! # Guarantees
//!
//! - [x] Acquire is one Lua script (`SET NX PX` and `INCR` of the key's
//!   token counter, one round trip); release is compare-and-delete, renew
//!   compare-and-`PEXPIRE`: only the owner's value is ever touched.
//! - [x] Fencing tokens per key on one server, Sentinel and Cluster (the
//!   counter shares the lock's hash tag, so one slot).
//! - [x] Waiting by notification (pub/sub on release, re-check at the
//!   holder's TTL); FIFO with `fair=true`.
//! - [x] Read-write locks and semaphores (not on Redlock), multi-locks in one
//!   script, elections over the renewed mutex.
//! - [x] Renewals pipelined per node; holder details, `list`,
//!   `force_release`, `gc` with a token floor.
//! - [x] Writes guarded by the store: a caller's Lua script run only while
//!   a mutex lease holds its lock, the owner check and the script in one
//!   call ([`RedisBackend::run_guarded`]; not on Redlock).
//!
//! # Caveats
//!
//! - **Not linearizable**: a failover to a lagging replica, or a restart
//!   without fsync, can grant a key twice and send its token **backwards**
//!   (`fencing_survives_failover` is `false`); `replicas=N` narrows that
//!   window and does not close it. Its `WAIT` runs right after the grant on
//!   the grant's own connection (`WAIT` only counts that connection's
//!   writes); a grant whose connection breaks before `WAIT` answers is
//!   undone like one whose answer was lost.
//! - An evicting `maxmemory-policy` deletes held locks or token counters: run
//!   with `noeviction` (checked at connect, see [`RedisBackend::eviction`]).
//! - **Redlock has no safe fencing token** ([`FencingScope::None`]) and its
//!   safety rests on timing: use it for efficiency, not for correctness.
//!
//! Capabilities say all of this as data ([`capabilities`]). The key layouts,
//! fair mode, the legacy layouts, Redlock, the operating calls, eviction, TLS
//! and how each is tested are described in depth in `docs/backends/redis.md`
//! of the repository.
//!
//! [`FencingScope::None`]: lock_core::FencingScope::None

#![deny(missing_docs)]

mod admin;
mod backend;
mod config;
mod connection;
mod descriptor;
mod error;
mod grants;
mod guarded;
pub mod keys;
mod renewal;
mod sets;
mod shared;
#[cfg(test)]
mod test_redis;
mod waiting;

pub use backend::{RedisBackend, capabilities};
pub use config::{
    DEFAULT_CONNECTIONS, DEFAULT_OPERATION_TIMEOUT, DEFAULT_PREFIX, DEFAULT_RECHECK, DEFAULT_TTL,
    EvictionMode, MAX_CONNECTIONS, MIN_TTL, RedisConfig, RedisNode, RedisTopology,
};
pub use connection::eviction::EvictionCheck;
pub use descriptor::DRIVER;
pub use guarded::{RedisGuardedReply, RedisGuardedScript};
pub use keys::layout::{DEFAULT_TOKEN_SUFFIX, RedisLayout};
/// The redis crate's reply value, as a guarded script's body answers it
/// ([`RedisGuardedReply::Ran`]).
pub use redis::Value as RedisValue;
pub use renewal::RedisRenewalStats;

/// Connects to the Redis deployment a URL names (see [`RedisConfig`] for the
/// forms).
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL;
/// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) /
/// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when not enough
/// servers answer.
///
/// # Cancel safety
///
/// Safe: dropping it drops the half-made connections.
pub async fn connect(url: &str) -> Result<RedisBackend, lock_core::LockError> {
    RedisBackend::connect(RedisConfig::from_url(url)?).await
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
    mut endpoint: lock_core::endpoint::Endpoint,
    requirements: lock_core::Requirements,
) -> Result<RedisBackend, lock_core::LockError> {
    // Fencing required: a Redis that may evict keys (and with them the
    // token counters) is refused, unless the URL chose the mode.
    let chosen = endpoint.options().contains("eviction");
    let mut config = RedisConfig::from_endpoint(endpoint)?;
    if requirements.fencing && !chosen {
        config = config.eviction(EvictionMode::Refuse);
    }
    RedisBackend::connect(config).await
}
