//! The core of the distlock family: one lock API over many backends.
//!
//! - [`LockBackend`]: the small, object-safe kernel every driver implements
//!   (grant, batch renewal, release, holders), with each method's contract
//!   written down; optional [`facets`] for the rest (administration,
//!   elections, atomic sets, downgrades, holder watches); and
//!   [`LockBackendExt`], the calls built on them.
//! - [`LockClient`] / [`LockGuard`]: what users hold. Guards are renewed by
//!   one renewal scheduler per backend and runtime (batched through
//!   [`LockBackend::renew_many`], not a task per guard); a guard exposes the [`FencingToken`] and the local validity deadline,
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
//! - TTLs are at least [`MIN_TTL_FLOOR`] (10 ms) on every backend: below it
//!   the drift allowance would leave a lease (almost) dead on arrival.
//!   Durations that would overflow a deadline (`Duration::MAX` waits, hold
//!   limits, intervals, retry delays) saturate to "never" instead of
//!   panicking ([`saturating_add`]); nonsense policies are refused with
//!   [`ErrorKind::InvalidArgument`].
//!
//! # Where renewal runs
//!
//! The renewal scheduler renews each lease when about a third of its TTL has
//! passed since the request that set its current deadline was sent, so a
//! slow grant is renewed early rather than a fixed interval after its
//! reply. It runs on a [`RenewalRuntime`]: by default one process-wide
//! current-thread Tokio runtime on a dedicated thread
//! ([`RENEWAL_THREAD_NAME`]), so that an application blocking its own
//! runtime (a synchronous call, a CPU-bound loop) does not starve it.
//! [`RenewalRuntime::current`] keeps renewal on the application's runtime.
//! Either way, any end of the scheduler's task other than its drop (a panic, its
//! runtime shutting down) makes the guard `Lost`, and a guard reads `Lost`
//! as soon as its local deadline has passed: never a silent expiry.
//!
//! For network backends the connection's own tasks run on the runtime the
//! backend was *connected* on, so renewal on the dedicated thread survives a
//! blocked application runtime only if the backend was connected there too:
//! use [`RenewalRuntime::run_on`] with the connect future. Otherwise the
//! dedicated scheduler still declares `Lost` on time while the renewal
//! request waits for the blocked runtime.
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
mod calls;
mod capabilities;
mod client;
pub mod driver;
pub mod election;
pub mod endpoint;
mod error;
pub mod facets;
mod guard;
mod hold;
mod holder;
mod key;
pub mod kind;
mod memory;
pub mod migration;
mod options;
mod owner;
mod redact;
pub mod reentry;
mod renew_many;
mod runtime;
mod scheduler;
mod telemetry;
mod token;
mod types;
pub mod wrapper;

// The test doubles the integration tests share, for the unit tests too.
#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod support;
#[cfg(test)]
use crate as under_test;

pub use backend::{
    GrantRequest, LockBackend, MAX_LIST_PAGE, check_list_limit, list_mutex_shared,
    unsupported_kind, unsupported_shape,
};
pub use calls::{LockBackendExt, poll_holder, poll_leader, watch_holder_with};
pub use capabilities::{Capabilities, FencingScope, Requirements, TtlModel, WaitStrategy};
pub use client::multi::{MAX_MULTI_KEYS, MultiGuard, MultiRequest, lock_order};
pub use client::segments::{MAX_SEGMENTS, SegmentRequest};
pub use client::{LockClient, LockDefaults, LockRequest};
pub use error::{ErrorKind, LockError, Operation};
pub use facets::{
    Admin, Downgrade, Elections, Facets, HolderWatch, Listing, LockSets, WatchRequest,
};
pub use guard::LockGuard;
pub use hold::{LockState, RenewalPolicy};
pub use holder::{HolderDetails, MAX_ENCODED_LEN, MAX_LABEL_LEN, holder_label, set_holder_label};
pub use key::{LockKey, MAX_KEY_LEN, RESERVED_KEY_PREFIX};
pub use kind::{HolderInfo, LeaseKind, LockShape, MAX_PERMITS};
pub use memory::{MemoryBackend, MemoryFault};
pub use migration::{
    CUTOVER_KEY_PREFIX, DEFAULT_MARKER_REFRESH, DEFAULT_MIGRATION_NAME, MigrationBackend,
    MigrationPhase, NEW_EPOCH, OLD_ONLY_MARK, is_old_only,
};
pub use options::{
    Backoff, FAR_FUTURE, MAX_TTL, MIN_TTL_FLOOR, RetryPolicy, check_ttl, parse_duration,
    random_delay, saturating_add, with_timeout,
};
pub use owner::{OwnerHex, OwnerId, RandomKeyHasher, RandomKeys};
pub use redact::redact_url;
pub use renew_many::{RENEW_BATCH, RENEW_CONCURRENCY, renew_concurrently, results_in_order};
pub use runtime::{RENEWAL_THREAD_NAME, RenewalRuntime};
pub use telemetry::{KeyLabel, disable_metrics, enable_metrics, metrics_enabled};
pub use token::FencingToken;
pub use types::{
    GcReport, Lease, ListQuery, LockInfo, LockPage, SessionState, SharedLockInfo, SharedPage,
    clock_drift, validity_deadline,
};
pub use wrapper::LockWrapper;

/// Re-exported so drivers and users name the same `async_trait`.
pub use async_trait::async_trait;
