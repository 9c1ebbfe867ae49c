//! The in-memory backend: a real lock service for one process.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use crate::backend::{GrantRequest, LockBackend, check_list_limit};
use crate::capabilities::{Capabilities, FencingScope, TtlModel, WaitStrategy};
use crate::error::{ErrorKind, LockError, Operation};
use crate::facets::{Admin, Downgrade, Facets, Listing, LockSets};
use crate::holder::HolderDetails;
use crate::key::LockKey;
use crate::kind::{HolderInfo, LeaseKind, LockShape};
use crate::options::{MIN_TTL_FLOOR, check_ttl};
use crate::types::{
    FencingToken, GcReport, Lease, ListQuery, LockInfo, LockPage, OwnerId, SharedPage,
};

mod shared;

const NAME: &str = "memory";

/// A fault to inject into a [`MemoryBackend`], standing in for what a
/// network or a paused server does to the other backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryFault {
    /// Normal operation.
    None,
    /// Every call fails at once with [`ErrorKind::Unavailable`].
    Unavailable,
    /// Every call hangs until the operation timeout, then fails with
    /// [`ErrorKind::Timeout`] (like a server paused with SIGSTOP).
    Hang,
}

/// A lock service inside this process.
///
/// - Grants are exact: one mutex orders every operation (linearizable).
/// - Fencing tokens come from one counter for all keys, so they strictly
///   increase per key *and* globally, and a free key needs no memory.
/// - Waiters are served first come, first served: a release or an expiry
///   hands the key directly to the oldest waiter, woken by a channel, with
///   no polling. Expiry is noticed by a timer at the holder's expiry instant.
///   A hand-off is dated when it is made; one that reaches its waiter only
///   after its deadline (the waiting task ran late) is given back and the
///   acquire fails with [`ErrorKind::LeaseLost`].
/// - Read-write locks and semaphores (see [`crate::kind`]): per key a list
///   of holders, each with its own expiry, and one FIFO queue, so a waiting
///   writer keeps new readers out and a large permit request is not
///   overtaken; read grants carry the last write grant's token.
/// - Clones share the same locks (they are handles to one service), so it
///   can stand for "several clients of one server" in tests.
///
/// It is not a mock: it is the reference the conformance suite runs first
/// and the embedded default for single-process programs.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockBackendExt, LockKey, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let backend = MemoryBackend::new();
/// let key = LockKey::new("reports")?;
/// let lease = backend.try_acquire(&key, Duration::from_secs(5)).await?.expect("free");
/// assert!(backend.try_acquire(&key, Duration::from_secs(5)).await?.is_none());
/// assert!(backend.release(&lease).await?);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    keys: Mutex<HashMap<LockKey, KeyState>>,
    /// Read-write locks and semaphores (see `shared`).
    shared: Mutex<shared::SharedKeys>,
    last_token: AtomicU64,
    next_waiter: AtomicU64,
    fault: AtomicU8,
    op_timeout: Duration,
}

#[derive(Debug, Default)]
struct KeyState {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerId,
    token: u64,
    expires_at: Instant,
    /// When it was granted (ms since the epoch): with this process's facts,
    /// the holder's details.
    granted_at_ms: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    ttl: Duration,
    tx: oneshot::Sender<Lease>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A new, empty lock service with a 5 s operation timeout (only used
    /// by [`MemoryFault::Hang`]).
    pub fn new() -> Self {
        Self::with_op_timeout(Duration::from_secs(5))
    }

    /// A new service whose injected hangs last `op_timeout`.
    pub fn with_op_timeout(op_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                keys: Mutex::new(HashMap::new()),
                shared: Mutex::new(HashMap::new()),
                last_token: AtomicU64::new(0),
                next_waiter: AtomicU64::new(0),
                fault: AtomicU8::new(0),
                op_timeout,
            }),
        }
    }

    /// Injects (or clears) a fault for every handle of this service.
    pub fn set_fault(&self, fault: MemoryFault) {
        let raw = match fault {
            MemoryFault::None => 0,
            MemoryFault::Unavailable => 1,
            MemoryFault::Hang => 2,
        };
        self.inner.fault.store(raw, Ordering::SeqCst);
    }

    /// The fault in force.
    pub fn fault(&self) -> MemoryFault {
        match self.inner.fault.load(Ordering::SeqCst) {
            1 => MemoryFault::Unavailable,
            2 => MemoryFault::Hang,
            _ => MemoryFault::None,
        }
    }

    /// How many keys currently have a holder or waiters (free keys take no
    /// memory).
    pub fn active_keys(&self) -> usize {
        let now = Instant::now();
        let mut keys = self.keys();
        keys.retain(|_, state| {
            state.reap(now);
            !state.is_idle()
        });
        keys.len()
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<LockKey, KeyState>> {
        locked(&self.inner.keys)
    }

    async fn check_fault(&self, operation: Operation) -> Result<(), LockError> {
        match self.fault() {
            MemoryFault::None => Ok(()),
            MemoryFault::Unavailable => Err(LockError::new(
                ErrorKind::Unavailable,
                operation,
                "injected fault: backend unavailable",
            )
            .with_backend(NAME)),
            MemoryFault::Hang => {
                tokio::time::sleep(self.inner.op_timeout).await;
                Err(LockError::new(
                    ErrorKind::Timeout,
                    operation,
                    "injected fault: no answer within the operation timeout",
                )
                .with_backend(NAME))
            }
        }
    }

    fn grant_to(&self, key: &LockKey, state: &mut KeyState, ttl: Duration, now: Instant) -> Lease {
        let owner = OwnerId::random();
        let token = self.next_token();
        state.holder = Some(Holder {
            owner,
            token,
            expires_at: now + ttl,
            granted_at_ms: crate::holder::now_ms(),
        });
        fresh_lease(key, owner, token, ttl, now)
    }

    /// Hands a free key to the oldest waiter still listening (under the
    /// store's lock, as every caller holds it).
    ///
    /// The grant is dated when it is made, read under the lock, not at
    /// `now` (when the caller, maybe the releaser, read the clock before it
    /// took the lock): the holder's expiry and the lease's deadline both
    /// count from that instant, so the lease promises no more than the
    /// store keeps. The waiter's own request was sent earlier still, but
    /// dating from it would hand every waiter that waited longer than its
    /// TTL a lease already over; the hand-off is the server's grant, on the
    /// waiter's own clock (one process). What the waiter must still check
    /// is that the lease has not run out by the time it takes it (its task
    /// may run late): see [`arrived`].
    fn hand_off(&self, key: &LockKey, state: &mut KeyState, now: Instant) {
        state.reap(now);
        while state.holder.is_none() {
            let Some(waiter) = state.waiters.pop_front() else {
                return;
            };
            if waiter.tx.is_closed() {
                continue;
            }
            let lease = self.grant_to(key, state, waiter.ttl, Instant::now());
            if waiter.tx.send(lease).is_err() {
                state.holder = None;
            }
        }
    }

    /// The next fencing token of the store (mutexes and shares draw from one
    /// counter).
    fn next_token(&self) -> u64 {
        self.inner.last_token.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn invalid(err: LockError, key: &LockKey) -> LockError {
        err.with_key(key).with_backend(NAME)
    }

    /// Gives a mutex grant back if it is still the holder (no fault
    /// checked): `release` without the injected faults, for a grant the
    /// store itself must undo.
    fn give_back(&self, lease: &Lease) -> bool {
        let now = Instant::now();
        let mut keys = self.keys();
        let Some(state) = keys.get_mut(lease.key()) else {
            return false;
        };
        state.reap(now);
        let ours = state
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == lease.owner());
        if ours {
            state.holder = None;
        }
        self.hand_off(lease.key(), state, now);
        if state.is_idle() {
            keys.remove(lease.key());
        }
        ours
    }
}

/// A handed-off `lease` as its waiter takes it: returned while its deadline
/// is ahead, else given back (`give_back`, so the key goes on to the next
/// waiter now, not at the stale holder's expiry) and refused with
/// [`ErrorKind::LeaseLost`], as a driver refuses a grant whose reply came
/// after its deadline. A hand-off waits in its channel until the waiter's
/// task runs, which may be arbitrarily late (a blocked runtime).
fn arrived(lease: Lease, give_back: impl FnOnce(&Lease)) -> Result<Lease, LockError> {
    if lease.validity_deadline() > Instant::now() {
        return Ok(lease);
    }
    give_back(&lease);
    Err(LockError::new(
        ErrorKind::LeaseLost,
        Operation::Acquire,
        "the hand-off reached the waiter after its validity deadline (the waiting task ran late)",
    )
    .with_key(lease.key())
    .with_backend(NAME))
}

/// The lease of a grant made at `now`. Granted and timed in one step under
/// the store's lock, so `now` is both when the request was served and when
/// the lease starts: never expired.
fn fresh_lease(key: &LockKey, owner: OwnerId, token: u64, ttl: Duration, now: Instant) -> Lease {
    Lease::from_parts(
        key.clone(),
        owner,
        FencingToken::new(token),
        ttl,
        crate::types::validity_deadline(now, ttl),
        String::new(),
    )
}

/// A queued waiter's end of its hand-off channel.
struct Pending {
    rx: oneshot::Receiver<Lease>,
    /// The grant (or the service's refusal) was taken from `rx`: the
    /// registration owning this has nothing left to withdraw.
    done: bool,
}

/// A key's entry in one of the store's maps (mutexes, or read-write locks
/// and semaphores) as its queued waiters see it.
trait Queue: Default {
    /// Hands the key on (to the head of the queue, as far as it fits) at
    /// `now`, under the store's lock.
    fn hand_off(&mut self, backend: &MemoryBackend, key: &LockKey, now: Instant);

    /// When the first holder's lease runs out (`None`: nobody holds).
    fn next_expiry(&self) -> Option<Instant>;

    /// Removes waiter `id` from the queue; `raced` is a grant handed to it
    /// that it never saw, whose hold is dropped too.
    fn withdraw(&mut self, id: u64, raced: Option<Lease>);

    /// Nothing held and nobody waiting: the entry can go.
    fn is_idle(&self) -> bool;
}

/// The store's lock on one of its maps. No code path panics while holding
/// it; recover anyway.
fn locked<T>(map: &Mutex<T>) -> MutexGuard<'_, T> {
    map.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waiter `id`, queued on `key` (entry `map_key` of `map`, one of
/// `backend`'s maps) by a waiting `acquire` (mutex or share): removed on
/// drop (cancellation or timeout), with a grant that raced with it given
/// back.
struct Registration<'a, K: Eq + Hash + Clone, S: Queue> {
    backend: &'a MemoryBackend,
    key: &'a LockKey,
    map: &'a Mutex<HashMap<K, S>>,
    map_key: K,
    id: u64,
    pending: Pending,
}

impl<'a, K: Eq + Hash + Clone, S: Queue> Registration<'a, K, S> {
    fn new(
        backend: &'a MemoryBackend,
        key: &'a LockKey,
        (map, map_key): (&'a Mutex<HashMap<K, S>>, K),
        id: u64,
        rx: oneshot::Receiver<Lease>,
    ) -> Self {
        Self {
            backend,
            key,
            map,
            map_key,
            id,
            pending: Pending { rx, done: false },
        }
    }

    /// The waiting half of the acquire: sleeps until the grant, the next
    /// `expiry` or the deadline, then runs the queue under the store's
    /// lock and looks again. The caller takes a grant through [`arrived`].
    /// Unless `pending.done` is set on return, the registration still owns
    /// the waiter and withdraws it on drop.
    async fn wait(
        &mut self,
        mut expiry: Option<Instant>,
        deadline: Instant,
        contended: impl FnOnce() -> String,
    ) -> Result<Lease, LockError> {
        let key = self.key;
        loop {
            let wake_at = expiry.map_or(deadline, |e| e.min(deadline));
            if let Some(granted) = granted_by(&mut self.pending.rx, wake_at, key).await {
                self.pending.done = true;
                return granted;
            }
            if let Err(err) = self.backend.check_fault(Operation::Acquire).await {
                return Err(err.with_key(key));
            }
            let now = Instant::now();
            expiry = {
                let mut map = locked(self.map);
                let state = map.entry(self.map_key.clone()).or_default();
                state.hand_off(self.backend, key, now);
                state.next_expiry()
            };
            if let Ok(lease) = self.pending.rx.try_recv() {
                self.pending.done = true;
                return Ok(lease);
            }
            if now >= deadline {
                // Leaving `done` unset: dropping the registration removes
                // the waiter.
                return Err(
                    LockError::new(ErrorKind::Contended, Operation::Acquire, contended())
                        .with_key(key)
                        .with_backend(NAME),
                );
            }
        }
    }
}

impl<K: Eq + Hash + Clone, S: Queue> Drop for Registration<'_, K, S> {
    fn drop(&mut self) {
        if self.pending.done {
            return;
        }
        let now = Instant::now();
        let mut map = locked(self.map);
        if let Some(state) = map.get_mut(&self.map_key) {
            // A grant made but never seen by the caller is released now.
            state.withdraw(self.id, self.pending.rx.try_recv().ok());
            state.hand_off(self.backend, self.key, now);
            if state.is_idle() {
                map.remove(&self.map_key);
            }
        }
    }
}

/// Waits for a hand-off on `rx` until `wake_at`: `Some` with the grant (or
/// the error of a waiter the service dropped), `None` when it is time to
/// look again.
async fn granted_by(
    rx: &mut oneshot::Receiver<Lease>,
    wake_at: Instant,
    key: &LockKey,
) -> Option<Result<Lease, LockError>> {
    tokio::select! {
        biased;
        granted = rx => Some(granted.map_err(|_| {
            LockError::new(ErrorKind::Backend, Operation::Acquire, "waiter dropped by the service")
                .with_key(key)
                .with_backend(NAME)
        })),
        () = sleep_until(wake_at) => None,
    }
}

impl Holder {
    fn info(&self, key: &LockKey, now: Instant) -> LockInfo {
        LockInfo {
            key: key.clone(),
            holder: self.owner.to_hex(),
            token: Some(FencingToken::new(self.token)),
            remaining_ttl: Some(self.expires_at.saturating_duration_since(now)),
            details: Some(HolderDetails::of_this_process(self.granted_at_ms)),
        }
    }
}

impl KeyState {
    fn reap(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.holder = None;
        }
    }
}

impl Queue for KeyState {
    fn hand_off(&mut self, backend: &MemoryBackend, key: &LockKey, now: Instant) {
        backend.hand_off(key, self, now);
    }

    fn next_expiry(&self) -> Option<Instant> {
        self.holder.as_ref().map(|h| h.expires_at)
    }

    fn withdraw(&mut self, id: u64, raced: Option<Lease>) {
        self.waiters.retain(|w| w.id != id);
        if let Some(lease) = raced
            && self
                .holder
                .as_ref()
                .is_some_and(|h| h.owner == lease.owner())
        {
            self.holder = None;
        }
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty()
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: FencingScope::Global,
            // One process, one store: there is no failover to survive.
            fencing_survives_failover: true,
            // Nothing to restart: the store is this process.
            grants_survive_restart: true,
            waiting: WaitStrategy::Notify,
            fifo: true,
            ttl_model: TtlModel::PerLease,
            linearizable: true,
            // Anything shorter is refused by `check_ttl` anyway: below it the
            // drift allowance leaves (almost) no validity.
            min_ttl: MIN_TTL_FLOOR,
            shared_locks: true,
            semaphores: true,
            holder_details: true,
            max_held: None,
        }
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        match (kind, deadline) {
            (LeaseKind::Exclusive, None) => self.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => {
                self.take_waiting(key, ttl, deadline).await.map(Some)
            }
            (_, deadline) => {
                check_ttl(ttl, self.capabilities().min_ttl, request.operation())
                    .map_err(|e| Self::invalid(e, key))?;
                match deadline {
                    None => self.try_acquire_share(request).await,
                    Some(deadline) => self.acquire_share(request, deadline).await.map(Some),
                }
            }
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        crate::renew_many::renew_concurrently(leases, crate::RENEW_CONCURRENCY, |lease| {
            self.renew_one(lease)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.check_fault(Operation::Release).await?;
        if lease.kind() != LeaseKind::Exclusive {
            return Ok(self.release_share(lease));
        }
        Ok(self.give_back(lease))
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        if shape == LockShape::Mutex {
            return Ok(crate::kind::mutex_holders(self.inspect_mutex(key).await?));
        }
        self.share_holders(key, shape).await
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            listing: Some(self),
            admin: Some(self),
            lock_sets: Some(self),
            downgrade: Some(self),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl Admin for MemoryBackend {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.check_fault(Operation::Release).await?;
        let now = Instant::now();
        let mut keys = self.keys();
        let Some(state) = keys.get_mut(key) else {
            return Ok(None);
        };
        state.reap(now);
        let broken = state.holder.take().map(|h| h.info(key, now));
        // The token counter is global and never reset: the next grant is
        // above the broken one.
        self.hand_off(key, state, now);
        if state.is_idle() {
            keys.remove(key);
        }
        Ok(broken)
    }

    /// Nothing to collect: a free key takes no memory here, and the token
    /// counter is one for every key.
    async fn gc(&self, _older_than: Duration) -> Result<GcReport, LockError> {
        self.check_fault(Operation::Inspect).await?;
        Ok(GcReport::default())
    }
}

#[async_trait]
impl Listing for MemoryBackend {
    async fn list_elections(
        &self,
        query: &ListQuery,
    ) -> Result<crate::election::ElectionPage, LockError> {
        crate::election::list_mutex_elections(self, query).await
    }

    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
        self.check_fault(Operation::Inspect).await?;
        let now = Instant::now();
        let mut keys = self.keys();
        let mut found: Vec<(&LockKey, &mut KeyState)> = keys
            .iter_mut()
            .filter(|(k, _)| {
                k.as_str().starts_with(prefix) && cursor.is_none_or(|c| k.as_str() > c)
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(b.0));
        let mut page = LockPage::default();
        for (key, state) in found {
            state.reap(now);
            if let Some(holder) = &state.holder {
                if page.locks.len() == limit {
                    page.cursor = page.locks.last().map(|l| l.key.as_str().to_owned());
                    break;
                }
                page.locks.push(holder.info(key, now));
            }
        }
        Ok(page)
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        if shape == LockShape::Mutex {
            return crate::backend::list_mutex_shared(self, query).await;
        }
        check_list_limit(query.limit).map_err(|e| e.with_backend(NAME))?;
        self.list_shares(shape, query).await
    }
}

#[async_trait]
impl LockSets for MemoryBackend {
    /// The whole set under the store's one lock: atomic, as the trait asks.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let Some(first) = keys.first() else {
            return Ok(Some(Vec::new()));
        };
        check_ttl(ttl, self.capabilities().min_ttl, Operation::TryAcquire)
            .map_err(|e| Self::invalid(e, first))?;
        self.check_fault(Operation::TryAcquire).await?;
        let now = Instant::now();
        let mut store = self.keys();
        for key in keys {
            if let Some(state) = store.get_mut(key) {
                state.reap(now);
                if state.holder.is_some() || !state.waiters.is_empty() {
                    return Ok(None);
                }
            }
        }
        Ok(Some(
            keys.iter()
                .map(|key| {
                    let state = store.entry(key.clone()).or_default();
                    self.grant_to(key, state, ttl, now)
                })
                .collect(),
        ))
    }
}

#[async_trait]
impl Downgrade for MemoryBackend {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.downgrade_share(lease).await
    }
}

/// The mutex's calls, which [`LockBackend::grant`] and the facets reach.
impl MemoryBackend {
    pub(crate) async fn try_take(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        check_ttl(ttl, self.capabilities().min_ttl, Operation::TryAcquire)
            .map_err(|e| Self::invalid(e, key))?;
        self.check_fault(Operation::TryAcquire).await?;
        let now = Instant::now();
        let mut keys = self.keys();
        let state = keys.entry(key.clone()).or_default();
        state.reap(now);
        // Waiters come first: a try never jumps the queue.
        if state.holder.is_some() || !state.waiters.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.grant_to(key, state, ttl, now)))
    }

    pub(crate) async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        check_ttl(ttl, self.capabilities().min_ttl, Operation::Acquire)
            .map_err(|e| Self::invalid(e, key))?;
        self.check_fault(Operation::Acquire).await?;
        let (tx, rx) = oneshot::channel();
        let id = self.inner.next_waiter.fetch_add(1, Ordering::Relaxed);
        let expiry = {
            let now = Instant::now();
            let mut keys = self.keys();
            let state = keys.entry(key.clone()).or_default();
            state.reap(now);
            if state.holder.is_none() && state.waiters.is_empty() {
                return Ok(self.grant_to(key, state, ttl, now));
            }
            state.waiters.push_back(Waiter { id, ttl, tx });
            self.hand_off(key, state, now);
            state.holder.as_ref().map(|h| h.expires_at)
        };
        let granted = Registration::new(self, key, (&self.inner.keys, key.clone()), id, rx)
            .wait(expiry, deadline, || {
                "still held by another owner at the wait deadline".to_owned()
            })
            .await?;
        arrived(granted, |lease| {
            self.give_back(lease);
        })
    }

    async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        // A lease rebuilt from parts may carry any TTL; no grant has one
        // outside these bounds.
        check_ttl(lease.ttl(), self.capabilities().min_ttl, Operation::Renew)
            .map_err(|e| Self::invalid(e, lease.key()))?;
        self.check_fault(Operation::Renew).await?;
        if lease.kind() != LeaseKind::Exclusive {
            return self.renew_share(lease);
        }
        let now = Instant::now();
        let mut keys = self.keys();
        let held = keys.get_mut(lease.key()).and_then(|state| {
            state.reap(now);
            state.holder.as_mut().filter(|h| h.owner == lease.owner())
        });
        match held {
            Some(holder) => {
                holder.expires_at = now + lease.ttl();
                Ok(crate::types::validity_deadline(now, lease.ttl()))
            }
            None => Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Renew,
                "the lease expired or belongs to someone else",
            )
            .with_key(lease.key())
            .with_backend(NAME)),
        }
    }

    async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.check_fault(Operation::Inspect).await?;
        let now = Instant::now();
        let mut keys = self.keys();
        let Some(state) = keys.get_mut(key) else {
            return Ok(None);
        };
        self.hand_off(key, state, now);
        Ok(state.holder.as_ref().map(|h| h.info(key, now)))
    }
}
