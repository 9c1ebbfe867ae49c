//! The trait every driver implements.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::election::{ElectionPage, Leader, election_lock_key};
use crate::error::LockError;
use crate::error::{ErrorKind, Operation};
use crate::key::LockKey;
use crate::kind::{HolderInfo, LeaseKind, LockShape};
use crate::types::{GcReport, Lease, ListQuery, LockInfo, LockPage, SharedLockInfo, SharedPage};

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
/// - **Kinds.** Read, write and permit grants (see [`crate::kind`]) are
///   asked for with [`try_acquire_kind`](Self::try_acquire_kind) and
///   [`acquire_kind`](Self::acquire_kind); the lease they return carries its
///   [`kind`](Lease::kind), and [`renew`](Self::renew),
///   [`renew_many`](Self::renew_many) and [`release`](Self::release) serve
///   every kind a backend grants. A backend that grants a kind says so in
///   [`Capabilities::shared_locks`] / [`Capabilities::semaphores`]; the
///   defaults refuse every kind but the mutex with
///   [`ErrorKind::Unsupported`].
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

    /// Tries once to take a grant of `kind` on `key` for `ttl`: as
    /// [`try_acquire`](Self::try_acquire), for any kind.
    ///
    /// Returns `Ok(None)` when the grant conflicts with a holder, or with a
    /// waiter queued before it (a waiting writer keeps new readers out; a
    /// waiting request for permits keeps later ones out). A write or permit
    /// grant gets a fresh fencing token; a read grant gets the token of the
    /// write epoch it reads (see [`crate::kind`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] for a kind the backend does not grant;
    /// [`ErrorKind::InvalidArgument`] for bad permit counts, or a semaphore
    /// limit that differs from the one its current holders or waiters use;
    /// otherwise as [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    async fn try_acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        match kind {
            LeaseKind::Exclusive => self.try_acquire(key, ttl).await,
            other => Err(unsupported_kind(
                self.name(),
                key,
                other,
                Operation::TryAcquire,
            )),
        }
    }

    /// Takes a grant of `kind` on `key`, waiting until `deadline`: as
    /// [`acquire`](Self::acquire), for any kind. Waiters of a read-write lock
    /// or a semaphore queue so that writers and large permit requests are
    /// not starved (in arrival order where [`Capabilities::fifo`] says so).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_kind`](Self::try_acquire_kind), plus
    /// [`ErrorKind::Contended`] at `deadline`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire): dropping withdraws the request and
    /// leaves nothing held past its TTL.
    async fn acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        match kind {
            LeaseKind::Exclusive => self.acquire(key, ttl, deadline).await,
            other => Err(unsupported_kind(
                self.name(),
                key,
                other,
                Operation::Acquire,
            )),
        }
    }

    /// Turns a held write lease into a read lease of the same key without
    /// letting any other writer in between (atomically on the server), and
    /// returns the read lease, which keeps the write lease's token (the
    /// epoch it wrote). The write lease is no longer valid afterwards.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotHeld`] when `lease` is not a write lease we still
    /// hold (nothing changed); [`ErrorKind::Unsupported`] on a backend
    /// without shared locks; timeouts and backend errors (the outcome is
    /// then unknown: the write lease may have been turned into a read lease
    /// with the same owner, which expires with its TTL).
    ///
    /// # Cancel safety
    ///
    /// As for a timeout: the lease is then either the write or the read
    /// lease, and expires with its TTL unless renewed.
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        Err(unsupported_kind(
            self.name(),
            lease.key(),
            LeaseKind::Read,
            Operation::Downgrade,
        ))
    }

    /// Every current holder of `key` in the namespace of `shape`: the one
    /// holder of a mutex, every reader or the writer of a read-write lock,
    /// every permit lease of a semaphore. Empty when the key is free.
    ///
    /// The default serves [`LockShape::Mutex`] from
    /// [`inspect`](Self::inspect) and refuses the others.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] for a shape the backend does not have;
    /// timeouts and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::Mutex => Ok(crate::kind::mutex_holders(self.inspect(key).await?)),
            other => Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Inspect,
                format!("{} has no {other} locks", self.name()),
            )
            .with_key(key)
            .with_backend(self.name())),
        }
    }
    /// Tries once to take every key of `keys` in one atomic exchange: all
    /// of them granted (one lease per key, in the order given, each with a
    /// fresh fencing token) or none.
    ///
    /// `keys` are distinct and in [`lock_order`](crate::lock_order);
    /// [`LockClient::lock_all`](crate::LockClient::lock_all) calls this
    /// first and, when it answers [`ErrorKind::Unsupported`], takes the keys
    /// one by one instead (the default). A backend overrides it where the
    /// whole set fits one round trip or one transaction (a Lua script on
    /// keys of one Redis slot, one etcd or SQL transaction); it may refuse a
    /// particular set (keys in different slots) with `Unsupported` too.
    /// Each lease is renewed and released like any other.
    ///
    /// Returns `Ok(None)` when some key of the set is held (nothing was
    /// granted).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] when the backend cannot take this set in
    /// one exchange; otherwise as [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire): a grant that raced with the
    /// drop expires with its TTL.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let _ = ttl;
        Err(LockError::new(
            ErrorKind::Unsupported,
            Operation::TryAcquire,
            format!("{} takes a set of keys one key at a time", self.name()),
        )
        .with_key(keys.first().map_or("", LockKey::as_str))
        .with_backend(self.name()))
    }

    /// Campaigns in the election named `election`: waits until this
    /// campaign leads (or `deadline`), and returns the leadership's lease,
    /// whose [`key`](Lease::key) is [`election_lock_key`]`(election)` and
    /// whose token is the leader's **term** (strictly increasing over the
    /// election's terms on a backend with fencing). The lease is renewed and
    /// released (resigned) through [`renew`](Self::renew) and
    /// [`release`](Self::release) like a lock's.
    ///
    /// The default is a waiting [`acquire`](Self::acquire) of the mutex
    /// [`election_lock_key`]`(election)`. A driver overrides this (with
    /// [`leader`](Self::leader) and [`watch_leader`](Self::watch_leader))
    /// to use its store's own election layout, so that other clients of
    /// that layout (`etcdctl elect`, Curator's `LeaderLatch`) see the same
    /// leader.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire): `Contended` when another candidate
    /// led until `deadline`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire): dropping withdraws the candidacy.
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.acquire(&election_lock_key(election)?, ttl, deadline)
            .await
    }

    /// Who leads the election named `election` right now (`None`: nobody).
    /// The default reads the mutex [`campaign`](Self::campaign) takes.
    ///
    /// # Errors
    ///
    /// Timeout, unavailable backend, backend error.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError> {
        Ok(self
            .inspect(&election_lock_key(election)?)
            .await?
            .map(Leader::from_info))
    }

    /// Waits until the leader of `election` is no longer `seen` (a
    /// different holder or term, or none), or until `deadline`, and returns
    /// the leader then. Observers call this in a loop.
    ///
    /// The default reads [`leader`](Self::leader) every `poll`; a driver
    /// with watches overrides it to wake on the store's notification (and
    /// may ignore `poll`).
    ///
    /// # Errors
    ///
    /// As [`leader`](Self::leader).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only (a watch it opened is closed when dropped).
    async fn watch_leader(
        &self,
        election: &LockKey,
        seen: Option<&Leader>,
        poll: Duration,
        deadline: Instant,
    ) -> Result<Option<Leader>, LockError> {
        poll_leader(self, election, seen, poll, deadline).await
    }

    /// Waits until the holder of the mutex `key` is no longer `seen` (a
    /// different holder or token, or none; see [`LockInfo::same_holder`]),
    /// or until `deadline`, and returns the holder then, as
    /// [`inspect`](Self::inspect) reports it. `distlock watch` calls this
    /// in a loop.
    ///
    /// The default reads [`inspect`](Self::inspect) every `poll`; a driver
    /// with watches overrides it to wake on the store's notification (and
    /// may ignore `poll`).
    ///
    /// # Errors
    ///
    /// As [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only (a watch it opened is closed when dropped).
    async fn watch_holder(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        poll: Duration,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        poll_holder(self, key, seen, poll, deadline).await
    }

    /// One page of the held mutexes whose key starts with the query's
    /// `prefix` (`""`: every key), each as [`inspect`](Self::inspect)
    /// reports it (holder, token, remaining TTL, holder details): at most
    /// `limit` locks (1..=[`MAX_LIST_PAGE`]), continuing from `cursor` (a
    /// previous page's [`LockPage::cursor`]; `None` starts over; see
    /// [`ListQuery::next_page`]). A page may hold fewer
    /// locks than `limit` while the scan goes on: each call examines a
    /// bounded number of keys, so it returns within the operation timeout
    /// however many keys the store has. Locks taken or freed during a scan
    /// may or may not appear; none appears twice on one page.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] where the backend cannot enumerate its
    /// locks (the default); [`ErrorKind::InvalidArgument`] for a `limit`
    /// out of range or a cursor this backend did not hand out; otherwise
    /// as [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let _ = query;
        Err(crate::holder::unsupported_admin(
            self.name(),
            "listing locks",
        ))
    }

    /// [`list`](Self::list) for the locks of `shape`: one page of the keys
    /// under `prefix` that have holders in that shape's namespace, each
    /// with every holder as [`holders`](Self::holders) reports them
    /// (kind, owner, token, remaining TTL, details), with the same bounds,
    /// cursor and guarantees as `list`.
    ///
    /// The default serves [`LockShape::Mutex`] from [`list`](Self::list)
    /// and refuses the others.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] where the backend cannot enumerate that
    /// shape; otherwise as [`list`](Self::list).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        match shape {
            LockShape::Mutex => list_mutex_shared(self, query).await,
            other => Err(crate::holder::unsupported_admin(
                self.name(),
                &format!("listing {other} locks"),
            )),
        }
    }

    /// One page of the elections whose name starts with the query's `prefix` that have
    /// a leader, each as [`leader`](Self::leader) reports it, with the
    /// bounds, cursor and guarantees of [`list`](Self::list).
    ///
    /// The default lists the default election's mutexes
    /// ([`list_mutex_elections`](crate::election::list_mutex_elections));
    /// a driver with its own [`campaign`](Self::campaign) layout overrides
    /// it.
    ///
    /// # Errors
    ///
    /// As [`list`](Self::list).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        crate::election::list_mutex_elections(self, query).await
    }

    /// Breaks the mutex on `key` whoever holds it: an operator's tool for a
    /// stuck lock. Returns the holder it removed, as
    /// [`inspect`](Self::inspect) saw it just before, or `None` when the key
    /// was free.
    ///
    /// The broken holder is not told; its next renewal fails (its guard
    /// reports `Lost`). On a backend with fencing tokens the next grant of
    /// `key` gets a token above the broken holder's (the per-key counter or
    /// the global revision is never reset by this call), so a resource that
    /// checks tokens rejects the old holder's late writes once the next
    /// holder has written.
    ///
    /// This is the driver's primitive and breaks any key, including the
    /// library's own [reserved keys](LockKey::is_reserved) (a migration's
    /// cutover marker). Operators' tools call
    /// [`LockClient::force_release`](crate::LockClient::force_release),
    /// which refuses those unless asked with
    /// [`force_release_reserved`](crate::LockClient::force_release_reserved).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] by default; otherwise as
    /// [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// The removal is one atomic request; cancelled, it either happened or
    /// did not.
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let _ = key;
        Err(crate::holder::unsupported_admin(
            self.name(),
            "breaking locks (force-release)",
        ))
    }

    /// Removes the per-key state (token counters, lease rows) of keys that
    /// nobody holds and nobody took for at least `older_than`, without
    /// letting any key's token go backwards: the backend first raises a
    /// token floor above every token it removes, and every later grant of a
    /// removed key starts above that floor. Bounded: one call examines a
    /// bounded number of keys; run it again while
    /// [`GcReport::removed`] is not zero.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] where the backend keeps no such state or
    /// cannot keep the floor (the default); otherwise as
    /// [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// Each removal is atomic with its floor update; a cancelled run has
    /// removed some keys and kept every token monotonic.
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let _ = older_than;
        Err(crate::holder::unsupported_admin(
            self.name(),
            "garbage collection of stale keys",
        ))
    }
}

/// [`LockBackend::list_shared`] for [`LockShape::Mutex`], from
/// [`list`](LockBackend::list): each held mutex with its one holder.
///
/// # Errors
///
/// As [`LockBackend::list`].
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn list_mutex_shared<B: LockBackend + ?Sized>(
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

/// [`LockBackend::watch_holder`]'s default, for wrappers that override it:
/// reads `backend`'s [`inspect`](LockBackend::inspect) every `poll` (at
/// least 5 ms) until the holder is no longer `seen` or `deadline` passed.
///
/// # Errors
///
/// As [`LockBackend::inspect`].
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn poll_holder<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    seen: Option<&LockInfo>,
    poll: Duration,
    deadline: Instant,
) -> Result<Option<LockInfo>, LockError> {
    watch_holder_with(backend, key, seen, poll, deadline, || {
        std::future::pending()
    })
    .await
}

/// [`LockBackend::watch_leader`]'s default, for wrappers that override it:
/// reads `backend`'s [`leader`](LockBackend::leader) every `poll` (at least
/// 5 ms) until the leader is no longer `seen` or `deadline` passed.
///
/// # Errors
///
/// As [`LockBackend::leader`].
///
/// # Cancel safety
///
/// Safe: read-only.
pub async fn poll_leader<B: LockBackend + ?Sized>(
    backend: &B,
    election: &LockKey,
    seen: Option<&Leader>,
    poll: Duration,
    deadline: Instant,
) -> Result<Option<Leader>, LockError> {
    watch_with(
        || backend.leader(election),
        |now| !Leader::same(now, seen),
        poll,
        deadline,
        std::future::pending,
    )
    .await
}

/// [`poll_holder`] that also wakes early: before each read it calls `arm`,
/// whose future (already listening when `arm` returns, so a change during
/// the read is not missed) completes on the store's notification that the
/// holder may have changed; the read is then repeated at once. A driver
/// whose store announces some changes (a release message) but not others
/// (an expiry) watches this way.
///
/// # Errors
///
/// As [`LockBackend::inspect`].
///
/// # Cancel safety
///
/// Safe: read-only (what `arm` subscribed is dropped with its future).
pub async fn watch_holder_with<B, A, F>(
    backend: &B,
    key: &LockKey,
    seen: Option<&LockInfo>,
    poll: Duration,
    deadline: Instant,
    arm: A,
) -> Result<Option<LockInfo>, LockError>
where
    B: LockBackend + ?Sized,
    A: FnMut() -> F,
    F: std::future::Future<Output = ()>,
{
    watch_with(
        || backend.inspect(key),
        |now| !LockInfo::same_holder(now, seen),
        poll,
        deadline,
        arm,
    )
    .await
}

/// The loop of the polling watches: `read` until `changed` says what it
/// read is no longer what the caller saw, or `deadline` passed; between
/// reads, `poll` (at least 5 ms) or the wake of the future `arm` returned
/// before the read, whichever comes first.
async fn watch_with<T, R, RF, A, F>(
    mut read: R,
    changed: impl Fn(Option<&T>) -> bool,
    poll: Duration,
    deadline: Instant,
    mut arm: A,
) -> Result<Option<T>, LockError>
where
    R: FnMut() -> RF,
    RF: std::future::Future<Output = Result<Option<T>, LockError>>,
    A: FnMut() -> F,
    F: std::future::Future<Output = ()>,
{
    let poll = poll.max(Duration::from_millis(5));
    loop {
        let woken = arm();
        let now = read().await?;
        if changed(now.as_ref()) || Instant::now() >= deadline {
            return Ok(now);
        }
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep_until(deadline.min(Instant::now() + poll)) => {}
        }
    }
}

/// The most locks one [`LockBackend::list`] page may return.
pub const MAX_LIST_PAGE: usize = 1000;

/// Checks a [`LockBackend::list`] page size.
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
