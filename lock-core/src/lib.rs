//! The core of the distlock family: one lock API over many backends.
//!
//! - [`LockBackend`]: the small, object-safe trait every driver implements,
//!   with each method's contract written down.
//! - [`LockClient`] / [`LockGuard`]: what users hold. The guard renews on its
//!   own task, exposes the [`FencingToken`] and the local validity deadline,
//!   and reports [`LockState`] `Held → Suspect → Lost`.
//! - [`Capabilities`]: what a backend guarantees, as data; [`Requirements`]
//!   are checked against them.
//! - [`LockError`]: one error type with an [`ErrorKind`] to match on.
//! - [`MemoryBackend`]: a real lock service for one process.
//!
//! # Semantics in brief
//!
//! - A grant carries a random 128-bit [`OwnerId`]; only that owner can renew
//!   or release it, atomically on the server.
//! - A lease's local validity deadline is `sent_at + ttl - drift`, on the
//!   monotonic clock from when the request was *sent* ([`validity_deadline`]);
//!   a lease past it is never handed out, and the guard reports `Lost` by then
//!   at the latest when renewals fail.
//! - Fencing tokens strictly increase over the grants of a key (see each
//!   backend's [`Capabilities::fencing`] for scope and caveats). Protect a
//!   resource by having it reject writes whose token is not greater than the
//!   last one it accepted: a paused or partitioned client that still
//!   *believes* it holds the lock is then harmless.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use lock_core::{LockClient, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let client = LockClient::new(MemoryBackend::new());
//! let total = client
//!     .with_lock("ledger", async { 40 + 2 })
//!     .await?;
//! assert_eq!(total, 42);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod backend;
mod capabilities;
mod client;
mod error;
mod guard;
mod key;
mod memory;
mod migration;
mod options;
mod types;

pub use backend::LockBackend;
pub use capabilities::{Capabilities, FencingScope, Requirements, TtlModel, WaitStrategy};
pub use client::{LockClient, LockDefaults, LockRequest};
pub use error::{ErrorKind, LockError, Operation};
pub use guard::{LockGuard, LockState, RenewalPolicy};
pub use key::{LockKey, MAX_KEY_LEN};
pub use memory::{MemoryBackend, MemoryFault};
pub use migration::{MigrationBackend, MigrationPhase, NEW_EPOCH};
pub use options::{
    Backoff, MAX_TTL, RetryPolicy, check_ttl, parse_duration, random_delay, with_timeout,
};
pub use types::{
    FencingToken, Lease, LockInfo, OwnerId, SessionState, clock_drift, validity_deadline,
};

/// Re-exported so drivers and users name the same `async_trait`.
pub use async_trait::async_trait;
