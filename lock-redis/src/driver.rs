//! `RedisBackend`: the `LockBackend` implementation for every topology.
//! Connecting is in `driver/connecting.rs`; one acquire attempt (on every
//! node), the undo of an unseen grant and the waiting acquire's next step
//! in `driver/attempt.rs`; the scripts' answers in `scripts.rs`.

mod admin;
mod attempt;
mod connecting;
mod fair;
mod multi;
mod shared;

pub use connecting::connect;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    Admin, Capabilities, Downgrade, ErrorKind, Facets, FencingScope, GcReport, GrantRequest,
    HolderInfo, HolderWatch, Lease, LeaseKind, ListQuery, Listing, LockBackend, LockError,
    LockInfo, LockKey, LockPage, LockSets, LockShape, Operation, OwnerId, TtlModel, WaitStrategy,
    async_trait, check_ttl,
};
use tokio::time::Instant;

use crate::batch::{Counters, Renewer};
use crate::config::{RedisConfig, RedisTopology};
use crate::conn::Node;
use crate::error::{NAME, renewed_until};
use crate::eviction::EvictionCheck;
use crate::keys::layout::{
    LEGACY_OWNER_MARK, check_cluster_slot, legacy_names, legacy_unsupported,
};
use crate::keys::{KeyNames, Scripts, TokenFloor};
use crate::notify::Notifier;
use attempt::{Attempt, Found, next_try};

/// The shortest TTL accepted: below it the clock-drift allowance and one
/// round trip eat the whole lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// A lock service on Redis: one server, a Sentinel-managed master, a
/// Cluster, or Redlock over independent servers (see the crate docs).
///
/// Clones share one connection per node, one pub/sub connection per node
/// and one renewal batcher per node.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{LockBackend, LockBackendExt, LockKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let backend = lock_redis::connect("redis://127.0.0.1:6379?prefix=app:").await?;
/// let key = LockKey::new("reports")?;
/// if let Some(lease) = backend.try_acquire(&key, Duration::from_secs(5)).await? {
///     println!("token {}", lease.token());
///     backend.release(&lease).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<RedisConfig>,
    scripts: Arc<Scripts>,
    nodes: Vec<Arc<Node>>,
    renewers: Vec<Renewer>,
    notifier: Notifier,
    redlock: bool,
    quorum: usize,
    eviction: EvictionCheck,
    /// Where the token floor keys (`gc`) are: one per server, one per
    /// Cluster slot, or none.
    floor: TokenFloor,
    /// Where the next `gc` run goes on scanning: the scan target (the
    /// Cluster master's index) and its `SCAN` cursor; `(0, 0)`: from the
    /// start.
    gc_cursor: std::sync::Mutex<(usize, u64)>,
}

impl Inner {
    fn gc_cursor(&self) -> (usize, u64) {
        *self
            .gc_cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_gc_cursor(&self, cursor: (usize, u64)) {
        *self
            .gc_cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = cursor;
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Renewal counts of a [`RedisBackend`] (see [`RedisBackend::renewal_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisRenewalStats {
    /// Renewal round trips (pipelines) sent.
    pub round_trips: u64,
    /// Renewals sent in them.
    pub renewals: u64,
}

impl RedisBackend {
    /// What the connect-time check of the servers' `maxmemory-policy`
    /// found (see [`RedisConfig::eviction`]).
    pub fn eviction(&self) -> &EvictionCheck {
        &self.inner.eviction
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The TTL the configuration proposes (the URL's `ttl` option).
    pub fn default_ttl(&self) -> Duration {
        self.inner.config.default_ttl
    }

    /// How many renewals this backend (and its clones) sent, and in how many
    /// round trips (pipelines), summed over nodes.
    pub fn renewal_stats(&self) -> RedisRenewalStats {
        use std::sync::atomic::Ordering;
        let mut stats = RedisRenewalStats::default();
        for renewer in &self.inner.renewers {
            stats.round_trips += renewer.counters().batches.load(Ordering::Relaxed);
            stats.renewals += renewer.counters().renewals.load(Ordering::Relaxed);
        }
        stats
    }

    /// The nodes, the scripts and each node's renewal counters (those of
    /// [`renewal_stats`](Self::renewal_stats)), for batched renewals
    /// (renew_many.rs).
    pub(crate) fn renewal_parts(&self) -> (&[Arc<Node>], &Arc<Scripts>, Vec<&Counters>) {
        (
            &self.inner.nodes,
            &self.inner.scripts,
            self.inner.renewers.iter().map(Renewer::counters).collect(),
        )
    }

    /// The Redis key that holds the lock `key`, for other clients that want
    /// to exclude with ours: `<prefix>{<key>}` in the native layout,
    /// `<prefix><key>` (the key itself when no prefix was set) in the
    /// legacy layouts (see the crate docs, *Legacy layouts*).
    pub fn redis_key(&self, key: &LockKey) -> String {
        self.layout_names(key).lock
    }

    /// The Redis names of `key`'s mutex in the configured layout. The
    /// library's own keys ([`LockKey::is_reserved`]: a migration's cutover
    /// marker) keep the native names (hash-tagged, so Cluster takes them)
    /// in every layout; the layout's scripts run on them unchanged.
    fn layout_names(&self, key: &LockKey) -> KeyNames {
        let config = &self.inner.config;
        if config.layout.is_legacy() && !key.is_reserved() {
            legacy_names(config.layout, &config.prefix, &config.token_suffix, key)
        } else {
            KeyNames::new(&config.prefix, key)
        }
    }

    /// [`layout_names`](Self::layout_names), refused in Cluster when a
    /// legacy key's counter would land in another slot (checked before
    /// anything is sent).
    fn names(&self, key: &LockKey, op: Operation) -> Result<KeyNames, LockError> {
        let names = self.layout_names(key);
        if self.inner.config.layout.is_legacy()
            && matches!(self.inner.config.topology, RedisTopology::Cluster(_))
        {
            check_cluster_slot(&names, key, op)?;
        }
        Ok(names)
    }

    /// The value that marks `owner` in the lock key (the hash field in
    /// the Redisson layout): its 32 hex digits in the native layout,
    /// `distlock:<hex>` in the legacy ones, whose other clients store 32
    /// hex digits of their own (redis-py's uuid, node-redlock's random
    /// bytes), so that `inspect` can tell our holders (and their token)
    /// from theirs.
    pub(crate) fn owner_value(&self, owner: OwnerId) -> String {
        if self.inner.config.layout.is_legacy() {
            format!("{LEGACY_OWNER_MARK}{}", owner.to_hex())
        } else {
            owner.to_hex()
        }
    }

    /// The refusal of a lock shape other than the mutex in a legacy layout.
    fn refuse_legacy(&self, op: Operation, what: &str, key: &LockKey) -> Result<(), LockError> {
        let layout = self.inner.config.layout;
        if layout.is_legacy() {
            return Err(legacy_unsupported(layout, op, what, key));
        }
        Ok(())
    }

    fn check_ttl(&self, ttl: Duration, op: Operation, key: &LockKey) -> Result<(), LockError> {
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_backend(NAME).with_key(key))
    }
}

/// What a backend with `config` guarantees: the same for every topology
/// but Redlock, whose token is not a safe fence (each node has its own
/// counter; see the crate docs). Needs no connection, so the descriptor
/// reports it from the URL alone.
// Every field is set today; the update keeps this compiling when lock-core
// adds a flag (at its weakest setting).
#[allow(clippy::needless_update)]
pub fn capabilities(config: &RedisConfig) -> Capabilities {
    let redlock = matches!(config.topology, RedisTopology::Redlock(_));
    // The legacy layouts have the mutex only (see the crate docs).
    let shapes = !redlock && !config.layout.is_legacy();
    Capabilities {
        fencing: if redlock {
            FencingScope::None
        } else {
            FencingScope::PerKey
        },
        // Not on Redlock: a majority of independent nodes gives no honest
        // order of readers, writers or permits (see the crate docs).
        shared_locks: shapes,
        semaphores: shapes,
        fencing_survives_failover: false,
        grants_survive_restart: false,
        waiting: WaitStrategy::Notify,
        // Redlock refuses `fair` (config validation).
        fifo: config.fair,
        ttl_model: TtlModel::PerLease,
        linearizable: false,
        min_ttl: MIN_TTL,
        // Every mutex grant (plain, fair, multi-lock; every layout and
        // topology) writes `<lock>:holder` in its script.
        holder_details: true,
        ..Capabilities::minimal()
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        capabilities(&self.inner.config)
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
            (kind, None) => {
                self.refuse_legacy(
                    Operation::TryAcquire,
                    "read-write locks and semaphores",
                    key,
                )?;
                self.try_acquire_shared(key, kind, ttl).await
            }
            (kind, Some(deadline)) => {
                self.refuse_legacy(Operation::Acquire, "read-write locks and semaphores", key)?;
                self.acquire_shared(key, kind, ttl, deadline)
                    .await
                    .map(Some)
            }
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        if leases.iter().any(|l| l.kind() != LeaseKind::Exclusive) {
            return self.renew_mixed(leases).await;
        }
        // One pipeline per node for the whole batch (see renew_many.rs).
        self.renew_pipelined(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.release_shared(lease).await;
        }
        let names = self.names(lease.key(), Operation::Release)?;
        let owner = self.owner_value(lease.owner());
        let (released, _not_held, errors) = self
            .inner
            .release_all(&names, &owner, self.inner.config.operation_timeout)
            .await;
        let quorum = self.inner.quorum;
        if released >= quorum || (self.inner.redlock && released > 0 && errors.is_empty()) {
            return Ok(true);
        }
        if released + errors.len() >= quorum && !errors.is_empty() {
            // Whether a majority held it is unknown: report the error; the
            // lease expires with its TTL where the release did not arrive.
            let err = errors.into_iter().next().unwrap_or_else(|| {
                LockError::new(ErrorKind::Unavailable, Operation::Release, "no answer")
            });
            return Err(err.with_key(lease.key()));
        }
        Ok(false)
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::Mutex => Ok(lock_core::kind::mutex_holders(
                self.inspect_mutex(key).await?,
            )),
            shape => {
                self.refuse_legacy(Operation::Inspect, "read-write locks and semaphores", key)?;
                self.holders_shared(key, shape).await
            }
        }
    }

    /// Administration and holder watches everywhere; sets of keys in one
    /// script and downgrades where the layout and topology have them (not
    /// on Redlock, not in the legacy layouts: see the crate docs).
    /// Elections are the renewed mutex (lock-core's default), watched as
    /// its holder.
    fn facets(&self) -> Facets<'_> {
        let ours = !self.inner.redlock && !self.inner.config.layout.is_legacy();
        Facets {
            listing: Some(self),
            admin: Some(self),
            lock_sets: ours.then_some(self as &dyn LockSets),
            downgrade: ours.then_some(self as &dyn Downgrade),
            holder_watch: Some(self),
            ..Facets::default()
        }
    }
}

#[async_trait]
impl Admin for RedisBackend {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.force_release_nodes(key).await
    }

    /// An empty report in the legacy layouts, whose counters sit in the
    /// other library's key space (see the crate docs, *Operating locks*).
    async fn gc(&self, older_than: Duration) -> Result<GcReport, LockError> {
        self.gc_counters(older_than).await
    }
}

#[async_trait]
impl Listing for RedisBackend {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        self.list_page(query).await
    }

    /// Read-write locks and semaphores by `SCAN` (one server, Sentinel,
    /// Cluster); the mutex from `list`; `Unsupported` for the shared
    /// shapes with Redlock and the legacy layouts.
    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<lock_core::SharedPage, LockError> {
        match shape {
            LockShape::Mutex => lock_core::list_mutex_shared(self, query).await,
            shape => self.list_shared_page(shape, query).await,
        }
    }

    /// Elections are the default mutexes.
    async fn list_elections(
        &self,
        query: &ListQuery,
    ) -> Result<lock_core::election::ElectionPage, LockError> {
        lock_core::election::list_mutex_elections(self, query).await
    }
}

#[async_trait]
impl HolderWatch for RedisBackend {
    /// A held key's release is published on its channel (by our release
    /// and force_release scripts, and by Redisson's unlock on that
    /// layout): while the key is held, subscribe first, then read, and wake
    /// on the message; `poll` still bounds each wait, since an expiry or a
    /// new grant of a free key publishes nothing.
    async fn watch_holder(
        &self,
        key: &LockKey,
        seen: Option<&LockInfo>,
        poll: Duration,
        deadline: Instant,
    ) -> Result<Option<LockInfo>, LockError> {
        if seen.is_none() {
            return lock_core::poll_holder(self, key, seen, poll, deadline).await;
        }
        let names = self.names(key, Operation::Inspect)?;
        let watch = self.inner.notifier.watch(&names.channel, deadline).await;
        lock_core::watch_holder_with(self, key, seen, poll, deadline, || {
            // Registered before the read so a release in between wakes us.
            let mut notified = Box::pin(watch.notify().notified());
            notified.as_mut().enable();
            notified
        })
        .await
    }
}

#[async_trait]
impl LockSets for RedisBackend {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        if let Some(first) = keys.first() {
            // lock-core takes the keys one at a time on `Unsupported`.
            self.refuse_legacy(Operation::TryAcquire, "one-script sets of keys", first)?;
        }
        self.try_acquire_set(keys, ttl).await
    }
}

#[async_trait]
impl Downgrade for RedisBackend {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        self.refuse_legacy(Operation::Downgrade, "read-write locks", lease.key())?;
        self.downgrade_shared(lease).await
    }
}

/// The mutex's calls, which [`LockBackend::grant`], `renew_many` and the
/// facets reach.
impl RedisBackend {
    async fn try_take(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        let op = Operation::TryAcquire;
        self.check_ttl(ttl, op, key)?;
        if self.inner.config.fair {
            return self.try_acquire_fair(key, ttl).await;
        }
        match self
            .attempt(key, ttl, op, self.inner.config.operation_timeout)
            .await?
        {
            Attempt::Granted(lease) => Ok(Some(lease)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    async fn take_waiting(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let op = Operation::Acquire;
        self.check_ttl(ttl, op, key)?;
        if self.inner.config.fair {
            return self.acquire_fair(key, ttl, deadline).await;
        }
        // The backoff after errors, made on the first error (it seeds itself
        // from the OS generator: nothing to pay on the common path).
        let mut errors = None;
        // First try without the notification machinery: on a free key (the
        // common case) the waiting acquire costs what a single try costs,
        // one round trip, with no SUBSCRIBE before it nor UNSUBSCRIBE after.
        let first = self
            .attempt(key, ttl, op, self.attempt_timeout(deadline))
            .await;
        if let Found::Granted(lease) = self.found(key, first, deadline, &mut errors)? {
            return Ok(lease);
        }
        // Found held: subscribe to the release channel, then try again at
        // once (the loop's first attempt), after the subscription is
        // confirmed, so a release between the first try and the
        // subscription is not missed.
        let names = self.names(key, op)?;
        let watch = self.inner.notifier.watch(&names.channel, deadline).await;
        loop {
            // Registered before the attempt so a release in between wakes us.
            let notified = watch.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let attempt = self
                .attempt(key, ttl, op, self.attempt_timeout(deadline))
                .await;
            let wait = match self.found(key, attempt, deadline, &mut errors)? {
                Found::Granted(lease) => return Ok(lease),
                Found::Wait(wait) => wait,
            };
            next_try(notified.as_mut(), wait, deadline, key).await?;
        }
    }

    /// One lease's renewal, every kind (the write leases of `renew_many`
    /// come here).
    pub(crate) async fn renew_one(&self, lease: &Lease) -> Result<Instant, LockError> {
        if lease.kind() != LeaseKind::Exclusive {
            return self.renew_shared(lease).await;
        }
        let op = Operation::Renew;
        let key = lease.key();
        self.check_ttl(lease.ttl(), op, key)?;
        let names = self.names(key, op)?;
        let owner = self.owner_value(lease.owner());
        let timeout = self.inner.config.operation_timeout;
        let calls = self
            .inner
            .renewers
            .iter()
            .map(|r| r.renew(&names.lock, &owner, lease.ttl(), timeout));
        let results = futures_util::future::join_all(calls).await;
        let mut renewed_at: Vec<Instant> = Vec::new();
        let mut not_held = 0;
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok((true, sent_at)) => renewed_at.push(sent_at),
                Ok((false, _)) => not_held += 1,
                Err(err) => errors.push(err),
            }
        }
        let n = self.inner.nodes.len();
        let quorum = self.inner.quorum;
        if renewed_at.len() >= quorum {
            let sent_at = renewed_at
                .iter()
                .copied()
                .min()
                .unwrap_or_else(Instant::now);
            return renewed_until(sent_at, lease.ttl(), op).map_err(|e| e.with_key(key));
        }
        if not_held > n - quorum {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                op,
                "the lock is not held by this lease any more",
            )
            .with_backend(NAME)
            .with_key(key));
        }
        let err = errors.into_iter().next().unwrap_or_else(|| {
            LockError::new(ErrorKind::Unavailable, op, "no majority answered").with_backend(NAME)
        });
        Err(err.with_key(key))
    }

    async fn inspect_mutex(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        Ok(self.inspect_nodes(key).await?.0)
    }
}
