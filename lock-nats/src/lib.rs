//! `nats://host:port[,host:port]/bucket`: locks in a NATS JetStream
//! key-value bucket (nats-server 2.11 or later), through `async-nats`.
//!
//! # What it guarantees
//!
//! - **Mutual exclusion by a KV create.** A grant publishes the owner to
//!   the key's subject with `Nats-Expected-Last-Subject-Sequence: 0` (no
//!   message for the key), or with the revision of the delete/purge
//!   marker a release or an expiry left: JetStream refuses it when the
//!   key has a value. Any other client doing a KV create on the same key
//!   (`kv.create` in nats-py, nats.go, `nats kv create`) excludes with
//!   this backend both ways. Lock key `k` is the KV key [`keys::kv_key`]
//!   (`jobs/nightly` stays `jobs/nightly`; other bytes are escaped).
//! - **Renew and release conditioned on the revision.** A renewal is an
//!   update with `Nats-Expected-Last-Subject-Sequence: <last revision>`
//!   and a fresh TTL; a release is a purge (`KV-Operation: PURGE`,
//!   `Nats-Rollup: sub`) conditioned the same way. Neither can touch a key
//!   that expired and was taken by someone else.
//! - **Per-key TTL.** Each grant and renewal carries a per-message TTL
//!   (`Nats-TTL`, server 2.11+; `async-nats` sends it with
//!   `create_with_ttl`, and this driver writes the same header itself for
//!   renewals, which `async-nats`'s `update` cannot). The server's unit is
//!   a whole second: a TTL is rounded **up** to whole seconds on the
//!   server (the holder's local validity is still `ttl − drift`), so the
//!   minimum TTL is 1 s ([`MIN_TTL`]). The bucket has *limit markers*
//!   (`subject_delete_marker_ttl` 1 s): an expiry leaves a marker that
//!   watchers see. A bucket created without per-message TTL is refused
//!   at connect with a `Config` error; this backend creates its bucket
//!   (history 1, file storage, `replicas` from the URL, default 1).
//! - **Fencing tokens** from the create's revision, i.e. the bucket
//!   stream's sequence: strictly increasing over successive grants of a
//!   key (in fact over every write to the bucket), replicated with the
//!   entry, so a new stream leader continues it. Scope: one bucket
//!   ([`FencingScope::PerKey`](lock_core::FencingScope::PerKey)); it starts
//!   over if the bucket is deleted and created again.
//! - **Waiting by a watch**: a waiter tries the create; while the key is
//!   held it listens to one watch of the bucket per backend value (an
//!   ordered consumer opened by the first waiter and closed about 5 s
//!   after the last: a consumer per wait would linger on the server for
//!   30 s after its client let go and hit the stream's limit of 1,000
//!   consumers) and tries again on its key's delete, purge or expiry
//!   marker, and every [`RECHECK`] at the latest (a watch cut by a leader
//!   change). Not FIFO.
//! - **Reads from the stream leader.** `inspect` and the owner checks of
//!   renew and release read the key's last message with `STREAM.MSG.GET`,
//!   which the stream's leader answers, not with `async-nats`'s direct
//!   get, which any replica may answer from behind (it showed a held key
//!   as free on the 3-node cluster).
//! - A waiting try answers by the acquire's deadline (250 ms after it when
//!   the deadline is due), not after the request timeout, while no leader
//!   serves the stream; a create cut off that way may still land, and its
//!   key then expires with its TTL.
//! - Holder details (host, pid, program, label) are stored in the value
//!   and reported by `inspect`; a value written by another client is
//!   reported whole as the holder, with the entry's revision as token.
//!
//! # A stream leader change
//!
//! With `replicas=3` the bucket is a Raft group of three servers. What
//! killing the stream leader (SIGKILL) does to an unexpired key, measured
//! by `tests/cluster.rs` (15 s TTL, longer than the election; nats-server
//! 2.15.1 on loopback): the key **survives** with its value and revision
//! (it was committed on a majority before the grant was acknowledged);
//! after the election (4.6 s and 7.1 s in two runs) another client's
//! create is still refused, `inspect` shows the same holder and token, the
//! holder's renewal (conditioned on the same revision) succeeds on the new
//! leader, and the key then expires one TTL after that renewal (15.0 s):
//! the new leader neither frees it early nor keeps it longer. During the
//! election requests fail with `Unavailable` or `Timeout`; a holder whose
//! renewals fail for longer than its validity reports `Lost`, the safe
//! side. Details in
//! `docs/backends/nats.md`.
//!
//! # What it cannot do
//!
//! - Sub-second TTLs (the server's unit is a second).
//! - Read-write locks, semaphores, listing, admin, elections of its own:
//!   refused with `Unsupported` (elections use the renewed mutex).
//! - A server older than 2.11 (no per-message TTL): connect fails.
//! - A grant on a key whose last message is another client's delete or
//!   purge marker (during the marker's 1 s of life) costs three round
//!   trips: the create, a read of the entry, the create over the marker.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let backend = lock_nats::connect("nats://127.0.0.1:4222/locks").await?;
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
mod grants;
pub mod keys;
mod renewal;
mod waiting;

pub use backend::{CAPABILITIES, MIN_TTL, NatsBackend};
pub use config::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_TIMEOUT, NatsConfig};
pub use descriptor::DRIVER;
pub use lock_core::LockError;
pub use waiting::RECHECK;

/// The backend's name (and the facade's cargo feature).
pub const NAME: &str = "nats";

/// Opens `nats://[user:password@]host[:port][,host[:port]...]/bucket`
/// (options `timeout`, `connect_timeout`, `replicas`; see
/// [`NatsConfig::from_url`]).
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a malformed URL
/// or a bucket without per-message TTL;
/// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) or
/// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when no server
/// answers within the connect and request timeouts.
///
/// # Cancel safety
///
/// Safe: nothing is held until it returns.
pub async fn connect(url: &str) -> Result<NatsBackend, LockError> {
    NatsBackend::connect(NatsConfig::from_url(url)?).await
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
) -> Result<NatsBackend, LockError> {
    NatsBackend::connect(NatsConfig::from_endpoint(endpoint)?).await
}
