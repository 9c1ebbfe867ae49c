//! The trait every driver implements.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::key::LockKey;
use crate::types::{Lease, LockInfo};

/// A lock service: the small, object-safe contract every driver implements.
///
/// Users normally go through [`LockClient`](crate::LockClient) and hold a
/// [`LockGuard`](crate::LockGuard); this trait is what a backend provides.
/// Every implementation must guarantee what each method's documentation
/// says; the `conformance` crate checks it.
///
/// Common rules for all methods:
///
/// - **Bounded time.** Every network call is bounded by the backend's
///   operation timeout; a call that times out returns
///   [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) and its outcome is
///   unknown (a grant may exist and will expire with its TTL).
/// - **Arguments** are checked before anything is sent: a TTL outside
///   `[capabilities().min_ttl, MAX_TTL]` is
///   [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument). No
///   input makes a backend panic.
/// - **Ownership.** Only the current owner of a grant can renew or release
///   it, atomically on the server: a stale lease never changes another
///   owner's grant.
/// - **Validity.** A returned lease's deadline is computed from when the
///   request was *sent* (see [`Lease::granted`]); a lease whose deadline has
///   passed is never returned.
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug {
    /// A short, stable name for reports and errors (`"memory"`, `"redis"`).
    fn name(&self) -> &'static str;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Tries once to take `key` for `ttl`.
    ///
    /// Returns `Ok(None)` when someone else holds the key. Atomic: either a
    /// new grant with a fresh fencing token exists and is returned, or
    /// nothing changed.
    ///
    /// # Errors
    ///
    /// Invalid TTL, timeout, unavailable backend, backend error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a grant on the server that nobody
    /// holds; it expires with its TTL (backends that can tell clean it up).
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError>;

    /// Takes `key` for `ttl`, waiting until `deadline` while someone else
    /// holds it.
    ///
    /// Waiting uses the backend's notification where it has one (see
    /// [`Capabilities::waiting`]) and polling with backoff otherwise.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Contended`](crate::ErrorKind::Contended) when the key was
    /// still held at `deadline` (returned within a small margin of it), plus
    /// the errors of [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the request: any waiting entry is
    /// removed (in the background where that needs a network call) and a
    /// grant that raced with the drop is released or expires with its TTL.
    /// No renewal ever runs for it.
    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError>;

    /// Extends `lease` by its TTL, measured from when this request is sent,
    /// and returns the new local validity deadline.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) when the lease is no
    /// longer ours (released, expired, taken over): nothing was changed.
    /// Timeouts and unavailability are temporary: the caller may retry until
    /// the lease's deadline.
    ///
    /// # Cancel safety
    ///
    /// Safe: a dropped renewal either happened or did not; the lease stays
    /// valid until its previous deadline either way.
    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError>;

    /// Renews many leases at once, as [`renew`](Self::renew) renews one, and
    /// returns one result per lease, in the order given.
    ///
    /// The guards' renewal scheduler calls this with every lease due at
    /// about the same time (at most [`RENEW_BATCH`](crate::RENEW_BATCH) per
    /// call). Each result obeys `renew`'s contract for its lease: a deadline
    /// measured from when *that lease's* renewal was sent, `NotHeld` only
    /// for a lease that is no longer ours. The default renews them with
    /// `renew`, [`RENEW_CONCURRENCY`](crate::RENEW_CONCURRENCY) at a time;
    /// drivers override it to renew a batch in a few round trips (one
    /// pipeline, one statement, one session keep-alive). A call must stay
    /// bounded by the backend's operation timeout, like `renew`.
    ///
    /// # Errors
    ///
    /// Per lease, as [`renew`](Self::renew). A result missing from the
    /// answer counts as a temporary backend error for that lease.
    ///
    /// # Cancel safety
    ///
    /// As [`renew`](Self::renew): each renewal happened or did not, and
    /// every lease stays valid until its previous deadline either way.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        crate::renew_many::renew_concurrently(self, leases, crate::RENEW_CONCURRENCY).await
    }

    /// Gives `lease` back.
    ///
    /// Returns `Ok(true)` when the lease was still ours and is now released,
    /// `Ok(false)` when it was not held any more (already released, expired,
    /// or someone else holds the key); another owner's grant is never
    /// touched. Releasing twice is harmless.
    ///
    /// # Errors
    ///
    /// Timeout, unavailable backend, backend error. The lease then expires
    /// with its TTL.
    ///
    /// # Cancel safety
    ///
    /// Safe: the release either happened or the lease expires with its TTL.
    async fn release(&self, lease: &Lease) -> Result<bool, LockError>;

    /// Reports who holds `key` right now, or `None` when it is free.
    ///
    /// A snapshot: it may be stale by the time it is read.
    ///
    /// # Errors
    ///
    /// Timeout, unavailable backend, backend error.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError>;
}
