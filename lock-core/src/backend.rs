//! The kernel every driver implements: [`LockBackend`], and the request
//! value of its one way to acquire, [`GrantRequest`].

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::error::{ErrorKind, Operation};
use crate::facets::{Facets, Listing};
use crate::key::LockKey;
use crate::kind::{HolderInfo, LeaseKind, LockShape};
use crate::types::{Lease, ListQuery, SharedLockInfo, SharedPage};

/// What one [`LockBackend::grant`] asks for: a grant of `kind` on `key` for
/// `ttl`, tried once (`deadline: None`) or waited for until `deadline`.
#[derive(Clone, Copy, Debug)]
pub struct GrantRequest<'a> {
    /// The key.
    pub key: &'a LockKey,
    /// The kind of grant ([`LeaseKind::Exclusive`] for a mutex).
    pub kind: LeaseKind,
    /// The lease's TTL.
    pub ttl: Duration,
    /// `None`: try once; `Some`: wait while the grant conflicts, until then.
    pub deadline: Option<Instant>,
}

impl<'a> GrantRequest<'a> {
    /// A mutex grant on `key` for `ttl`, tried once.
    pub fn mutex(key: &'a LockKey, ttl: Duration) -> Self {
        Self {
            key,
            kind: LeaseKind::Exclusive,
            ttl,
            deadline: None,
        }
    }

    /// This request of another kind.
    #[must_use]
    pub fn kind(self, kind: LeaseKind) -> Self {
        Self { kind, ..self }
    }

    /// This request, waiting until `deadline`.
    #[must_use]
    pub fn until(self, deadline: Instant) -> Self {
        Self {
            deadline: Some(deadline),
            ..self
        }
    }

    /// `Ok` for a mutex grant; for another kind, the
    /// [`unsupported_kind`] error of a `backend` that grants mutexes only.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] for a read, write or permit grant.
    pub fn mutex_only(&self, backend: &'static str) -> Result<(), LockError> {
        match self.kind {
            LeaseKind::Exclusive => Ok(()),
            kind => Err(unsupported_kind(backend, self.key, kind, self.operation())),
        }
    }

    /// The operation this request is, for errors.
    pub fn operation(&self) -> Operation {
        match self.deadline {
            None => Operation::TryAcquire,
            Some(_) => Operation::Acquire,
        }
    }
}

/// A lock service: the small, object-safe contract every driver implements
/// (the *kernel*), and the optional [`Facets`] it has.
///
/// Users normally go through [`LockClient`](crate::LockClient) and hold a
/// [`LockGuard`](crate::LockGuard); tools and tests call a backend through
/// [`LockBackendExt`](crate::LockBackendExt), whose conveniences (one
/// lease's renewal, `inspect`, the mutex-based election where the backend
/// has none) are built on this trait and its facets and cannot be
/// overridden. Every implementation must guarantee what each method's
/// documentation says; the `conformance` crate checks it.
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
/// - **Kinds.** Read, write and permit grants (see [`crate::kind`]) are
///   asked for with [`grant`](Self::grant) like the mutex; the lease
///   carries its [`kind`](Lease::kind), and [`renew_many`](Self::renew_many)
///   and [`release`](Self::release) serve every kind a backend grants. A
///   backend that grants a kind says so in [`Capabilities::shared_locks`] /
///   [`Capabilities::semaphores`] and refuses the others with
///   [`ErrorKind::Unsupported`] ([`unsupported_kind`]).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug {
    /// A short, stable name for reports and errors (`"memory"`, `"redis"`).
    fn name(&self) -> &'static str;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Takes a grant of `request.kind` on `request.key` for `request.ttl`.
    ///
    /// Tried once (`deadline: None`): `Ok(None)` when the grant conflicts
    /// with a holder, or with a waiter queued before it (a waiting writer
    /// keeps new readers out; a waiting request for permits keeps later
    /// ones out). Atomic: either a new grant exists and is returned, or
    /// nothing changed. A mutex, write or permit grant gets a fresh fencing
    /// token; a read grant gets the token of the write epoch it reads (see
    /// [`crate::kind`]).
    ///
    /// With a deadline, waits while the grant conflicts, using the
    /// backend's notification where it has one (see
    /// [`Capabilities::waiting`]) and polling with backoff otherwise;
    /// waiters of a read-write lock or a semaphore queue so that writers
    /// and large permit requests are not starved (in arrival order where
    /// [`Capabilities::fifo`] says so). Never `Ok(None)`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Contended`](crate::ErrorKind::Contended) when the grant
    /// still conflicted at the deadline (returned within a small margin of
    /// it); [`ErrorKind::Unsupported`] for a kind the backend does not
    /// grant; [`ErrorKind::InvalidArgument`] for a bad TTL, bad permit
    /// counts, or a semaphore limit that differs from the one its current
    /// holders or waiters use; timeout, unavailable backend, backend error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the request: any waiting entry is
    /// removed (in the background where that needs a network call) and a
    /// grant that raced with the drop is released or expires with its TTL.
    /// No renewal ever runs for it.
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError>;

    /// Extends each lease by its TTL, measured from when *that lease's*
    /// renewal is sent, and returns one result per lease, in the order
    /// given: the new local validity deadline.
    ///
    /// The guards' renewal scheduler calls this with every lease due at
    /// about the same time (at most [`RENEW_BATCH`](crate::RENEW_BATCH) per
    /// call); a driver renews a batch in a few round trips (one pipeline,
    /// one statement, one session keep-alive), or one by one with
    /// [`renew_concurrently`](crate::renew_concurrently). A call stays
    /// bounded by the backend's operation timeout.
    ///
    /// # Errors
    ///
    /// Per lease: [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) when the
    /// lease is no longer ours (released, expired, taken over): nothing was
    /// changed. Timeouts and unavailability are temporary: the caller may
    /// retry until the lease's deadline. A result missing from the answer
    /// counts as a temporary backend error for that lease.
    ///
    /// # Cancel safety
    ///
    /// Safe: each renewal happened or did not, and every lease stays valid
    /// until its previous deadline either way.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>>;

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

    /// Every current holder of `key` in the namespace of `shape`: the one
    /// holder of a mutex, every reader or the writer of a read-write lock,
    /// every permit lease of a semaphore. Empty when the key is free.
    ///
    /// A snapshot: it may be stale by the time it is read.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] for a shape the backend does not have
    /// ([`unsupported_shape`]); timeouts and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError>;

    /// The optional parts this backend has: administration, elections of
    /// its own layout, atomic sets of keys, downgrades, holder watches. A
    /// facet's presence is the capability; the conformance suite checks
    /// every facet a backend has. None by default.
    fn facets(&self) -> Facets<'_> {
        Facets::default()
    }
}

/// The error a backend returns for a shape it does not have.
pub fn unsupported_shape(backend: &'static str, key: &LockKey, shape: LockShape) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        Operation::Inspect,
        format!("{backend} has no {shape} locks"),
    )
    .with_key(key)
    .with_backend(backend)
}

/// [`Listing::list_shared`](crate::Listing::list_shared) for [`LockShape::Mutex`], from
/// [`list`](Listing::list): each held mutex with its one holder.
///
/// # Errors
///
/// As [`Listing::list`](crate::Listing::list).
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn list_mutex_shared<B: Listing + ?Sized>(
    backend: &B,
    query: &ListQuery,
) -> Result<SharedPage, LockError> {
    let page = backend.list(query).await?;
    Ok(SharedPage {
        locks: page
            .locks
            .into_iter()
            .map(|info| SharedLockInfo {
                key: info.key.clone(),
                holders: vec![HolderInfo::from(info)],
            })
            .collect(),
        cursor: page.cursor,
    })
}

/// The most locks one [`Listing::list`](crate::Listing::list) page may return.
pub const MAX_LIST_PAGE: usize = 1000;

/// Checks an [`Listing::list`](crate::Listing::list) page size.
///
/// # Errors
///
/// [`ErrorKind::InvalidArgument`] outside `1..=MAX_LIST_PAGE`.
pub fn check_list_limit(limit: usize) -> Result<(), LockError> {
    if (1..=MAX_LIST_PAGE).contains(&limit) {
        Ok(())
    } else {
        Err(LockError::invalid_argument(
            Operation::Inspect,
            format!("a list page holds 1 to {MAX_LIST_PAGE} locks, not {limit}"),
        ))
    }
}

/// The error a backend returns for a kind of grant it does not provide.
pub fn unsupported_kind(
    backend: &'static str,
    key: &LockKey,
    kind: LeaseKind,
    operation: Operation,
) -> LockError {
    let what = match kind.shape() {
        LockShape::ReadWrite => "read-write locks",
        LockShape::Semaphore => "semaphores",
        LockShape::Mutex => "this kind of grant",
    };
    LockError::new(
        ErrorKind::Unsupported,
        operation,
        format!("{backend} does not provide {what}"),
    )
    .with_key(key)
    .with_backend(backend)
}
