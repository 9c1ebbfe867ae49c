//! The optional parts of a backend, beyond its kernel
//! ([`LockBackend`](crate::LockBackend)): each a trait of its own, reached
//! through [`LockBackend::facets`](crate::LockBackend::facets). A facet's
//! presence is the capability: a backend that has one serves every call of
//! it (the conformance suite checks each facet a backend has, and fails a
//! facet call that answers `Unsupported`); one that has not leaves it out,
//! and callers fall back where there is a sensible way (see
//! [`LockBackendExt`](crate::LockBackendExt)) or say so.
//!
//! A [`LockWrapper`](crate::LockWrapper) forwards its inner backend's
//! facets unless it overrides [`facets`](crate::LockWrapper::facets).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::election::record::{ElectionPage, Leader};
use crate::error::LockError;
use crate::key::LockKey;
use crate::kind::LockShape;
use crate::types::{GcReport, Lease, ListQuery, LockInfo, LockPage, SharedPage};

/// What one watch asks for ([`Elections::watch_leader`],
/// [`HolderWatch::watch_holder`]): wait until what `key` holds (its leader
/// `T = Leader`, its holder `T = LockInfo`) is no longer `seen`, or until
/// `deadline`, checking at least every `poll` where the store misses some
/// changes.
#[derive(Debug)]
pub struct WatchRequest<'a, T> {
    /// The key watched (the election's name for a leader).
    pub key: &'a LockKey,
    /// What the caller last saw (`None`: nobody); the watch returns once it
    /// changes.
    pub seen: Option<&'a T>,
    /// The longest wait between checks.
    pub poll: Duration,
    /// When the watch returns whatever it reads.
    pub deadline: Instant,
}

// Not derived: a derive would require `T: Copy`, and only references to `T`
// are held.
impl<T> Clone for WatchRequest<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for WatchRequest<'_, T> {}

impl<'a, T> WatchRequest<'a, T> {
    /// A watch of `key` past `seen`, checking every `poll`, until `deadline`.
    pub fn new(key: &'a LockKey, seen: Option<&'a T>, poll: Duration, deadline: Instant) -> Self {
        Self {
            key,
            seen,
            poll,
            deadline,
        }
    }
}

/// The facets a backend has (see the [module docs](self)); `None` for each
/// it has not.
#[derive(Clone, Copy, Default)]
pub struct Facets<'a> {
    /// Listing locks and elections.
    pub listing: Option<&'a dyn Listing>,
    /// Breaking and collecting locks: the operators' tools.
    pub admin: Option<&'a dyn Admin>,
    /// Elections in the store's own layout (`etcdctl elect`, Curator's
    /// `LeaderLatch`).
    pub elections: Option<&'a dyn Elections>,
    /// Sets of keys taken in one atomic exchange.
    pub lock_sets: Option<&'a dyn LockSets>,
    /// Write leases turned into read leases without a gap.
    pub downgrade: Option<&'a dyn Downgrade>,
    /// Waiting for a mutex's holder to change on the store's notification.
    pub holder_watch: Option<&'a dyn HolderWatch>,
}

impl fmt::Debug for Facets<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Facets")
            .field("listing", &self.listing.is_some())
            .field("admin", &self.admin.is_some())
            .field("elections", &self.elections.is_some())
            .field("lock_sets", &self.lock_sets.is_some())
            .field("downgrade", &self.downgrade.is_some())
            .field("holder_watch", &self.holder_watch.is_some())
            .finish()
    }
}

impl Facets<'_> {
    /// The names of the facets present, for reports (`listing`, `admin`,
    /// `elections`, `lock_sets`, `downgrade`, `holder_watch`).
    pub fn names(&self) -> Vec<&'static str> {
        [
            ("listing", self.listing.is_some()),
            ("admin", self.admin.is_some()),
            ("elections", self.elections.is_some()),
            ("lock_sets", self.lock_sets.is_some()),
            ("downgrade", self.downgrade.is_some()),
            ("holder_watch", self.holder_watch.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, present)| present.then_some(name))
        .collect()
    }
}

/// Listing locks and elections: what is held, by whom.
#[async_trait]
pub trait Listing: Send + Sync {
    /// One page of the held mutexes whose key starts with the query's
    /// `prefix` (`""`: every key), each as
    /// [`inspect`](crate::LockBackendExt::inspect) reports it (holder,
    /// token, remaining TTL, holder details): at most `limit` locks
    /// (1..=[`MAX_LIST_PAGE`](crate::MAX_LIST_PAGE)), continuing from
    /// `cursor` (a previous page's [`LockPage::cursor`]; `None` starts
    /// over; see [`ListQuery::next_page`]). A page may hold fewer locks
    /// than `limit` while the scan goes on: each call examines a bounded
    /// number of keys, so it returns within the operation timeout however
    /// many keys the store has. Locks taken or freed during a scan may or
    /// may not appear; none appears twice on one page.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// for a `limit` out of range or a cursor this backend did not hand
    /// out; timeouts and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError>;

    /// [`list`](Self::list) for the locks of `shape`: one page of the keys
    /// under `prefix` that have holders in that shape's namespace, each
    /// with every holder as [`holders`](crate::LockBackend::holders)
    /// reports them, with the same bounds, cursor and guarantees as
    /// `list`. A backend with mutexes only serves it with
    /// [`list_mutex_shared`](crate::list_mutex_shared).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) for a shape
    /// the backend does not have; otherwise as [`list`](Self::list).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError>;

    /// One page of the elections whose name starts with the query's
    /// `prefix` that have a leader, each as
    /// [`leader`](crate::LockBackendExt::leader) reports it, with the
    /// bounds, cursor and guarantees of [`list`](Self::list). A backend
    /// whose elections are the default mutexes serves it with
    /// [`list_mutex_elections`](crate::election::list_mutex_elections).
    ///
    /// # Errors
    ///
    /// As [`list`](Self::list).
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError>;
}

/// Breaking and collecting locks: the operators' tools.
#[async_trait]
pub trait Admin: Send + Sync {
    /// Breaks the mutex on `key` whoever holds it: an operator's tool for a
    /// stuck lock. Returns the holder it removed, as `inspect` saw it just
    /// before, or `None` when the key was free.
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
    /// Timeout, unavailable backend, backend error.
    ///
    /// # Cancel safety
    ///
    /// The removal is one atomic request; cancelled, it either happened or
    /// did not.
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError>;

    /// Removes the per-key state (token counters, lease rows) of keys that
    /// nobody holds and nobody took for at least `older_than`, without
    /// letting any key's token go backwards: the backend first raises a
    /// token floor above every token it removes, and every later grant of a
    /// removed key starts above that floor. Bounded: one call examines a
    /// bounded number of keys; run it again while [`GcReport::removed`] is
    /// not zero. A backend that keeps no per-key state answers an empty
    /// report.
    ///
    /// # Errors
    ///
    /// Timeouts and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Each removal is atomic with its floor update; a cancelled run has
    /// removed some keys and kept every token monotonic.
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError>;
}

/// Elections in the store's own layout, so that other clients of that
/// layout (`etcdctl elect`, Curator's `LeaderLatch`) see the same leader.
/// Without this facet, [`LockBackendExt::campaign`](crate::LockBackendExt::campaign)
/// elects through the mutex
/// [`election_lock_key`](crate::election::election_lock_key)`(election)`.
#[async_trait]
pub trait Elections: Send + Sync {
    /// Campaigns in the election named `election`: waits until this
    /// campaign leads (or `deadline`), and returns the leadership's lease,
    /// whose [`key`](Lease::key) is
    /// [`election_lock_key`](crate::election::election_lock_key)`(election)`
    /// and whose token is the leader's **term** (strictly increasing over
    /// the election's terms on a backend with fencing). The lease is renewed
    /// and released (resigned) through the kernel like a lock's.
    ///
    /// # Errors
    ///
    /// `Contended` when another candidate led until `deadline`; otherwise
    /// as [`LockBackend::grant`](crate::LockBackend::grant).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the candidacy.
    async fn campaign(
        &self,
        election: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError>;

    /// Who leads the election named `election` right now (`None`: nobody).
    ///
    /// # Errors
    ///
    /// Timeout, unavailable backend, backend error.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only.
    async fn leader(&self, election: &LockKey) -> Result<Option<Leader>, LockError>;

    /// Waits until the leader of the election `request.key` is no longer
    /// `request.seen` (a different holder or term, or none), or until
    /// `request.deadline`, and returns the leader then, waking on the store's notification (`request.poll` bounds
    /// the wait between checks where the store misses some changes).
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
        request: WatchRequest<'_, Leader>,
    ) -> Result<Option<Leader>, LockError>;
}

/// Sets of keys taken in one atomic exchange.
#[async_trait]
pub trait LockSets: Send + Sync {
    /// Tries once to take every key of `keys` in one atomic exchange: all
    /// of them granted (one lease per key, in the order given, each with a
    /// fresh fencing token) or none. `keys` are distinct and in
    /// [`lock_order`](crate::lock_order). Each lease is renewed and
    /// released like any other. Returns `Ok(None)` when some key of the set
    /// is held (nothing was granted).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) for a set
    /// this backend cannot take in one exchange (keys in different Redis
    /// slots): [`LockClient::lock_all`](crate::LockClient::lock_all) then
    /// takes the keys one by one; otherwise as
    /// [`LockBackend::grant`](crate::LockBackend::grant).
    ///
    /// # Cancel safety
    ///
    /// A grant that raced with the drop expires with its TTL.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError>;
}

/// Write leases turned into read leases without a gap.
#[async_trait]
pub trait Downgrade: Send + Sync {
    /// Turns a held write lease into a read lease of the same key without
    /// letting any other writer in between (atomically on the server), and
    /// returns the read lease, which keeps the write lease's token (the
    /// epoch it wrote). The write lease is no longer valid afterwards.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) when `lease` is not
    /// a write lease we still hold (nothing changed); timeouts and backend
    /// errors (the outcome is then unknown: the write lease may have been
    /// turned into a read lease with the same owner, which expires with its
    /// TTL).
    ///
    /// # Cancel safety
    ///
    /// As for a timeout: the lease is then either the write or the read
    /// lease, and expires with its TTL unless renewed.
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError>;
}

/// Waiting for a mutex's holder to change on the store's notification.
/// Without this facet,
/// [`LockBackendExt::watch_holder`](crate::LockBackendExt::watch_holder)
/// polls.
#[async_trait]
pub trait HolderWatch: Send + Sync {
    /// Waits until the holder of the mutex `request.key` is no longer
    /// `request.seen` (a different holder or token, or none; see
    /// [`LockInfo::same_holder`]), or until `request.deadline`, and returns
    /// the holder then, as `inspect` reports it (`request.poll` bounds the wait between checks where the store
    /// misses some changes, such as expiries).
    ///
    /// # Errors
    ///
    /// Timeouts and backend errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: read-only (a watch it opened is closed when dropped).
    async fn watch_holder(
        &self,
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError>;
}
