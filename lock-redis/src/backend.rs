//! [`RedisBackend`]: the components of a Redis lock service, and the
//! kernel (`LockBackend`) and facets they serve.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    Capabilities, Facets, FencingScope, GrantRequest, HolderInfo, HolderWatch, Lease, LeaseKind,
    LockBackend, LockError, LockInfo, LockKey, LockSets, LockShape, Operation, TtlModel,
    WaitStrategy, WatchRequest, async_trait,
};
use tokio::time::Instant;

use crate::admin::Admin;
use crate::config::{MIN_TTL, RedisConfig, RedisTopology};
use crate::connection::{EvictionCheck, Servers};
use crate::error::NAME;
use crate::grants::Grants;
use crate::guarded::{RedisGuardedReply, RedisGuardedScript};
use crate::renewal::{RedisRenewalStats, Renewal};
use crate::sets::Sets;
use crate::shared::Shared;
use crate::waiting::Waiting;

/// A lock service on Redis: one server, a Sentinel-managed master, a
/// Cluster, or Redlock over independent servers (see the crate docs).
///
/// Clones share the data connections of each node
/// ([`RedisConfig::connections`]), one pub/sub connection per node and
/// one renewal batcher per node.
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
    servers: Arc<Servers>,
    grants: Grants,
    waiting: Waiting,
    renewal: Renewal,
    shared: Shared,
    sets: Sets,
    admin: Admin,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.servers.config)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects with `config`: opens the shared connections of each node
    /// and loads the scripts. Must be called within a Tokio runtime (the
    /// backend runs its pub/sub and renewal-batching tasks on it). Redlock needs a majority of its nodes to answer;
    /// the others are connected later, when they come back.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad
    /// configuration or wrong credentials;
    /// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) /
    /// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when not enough
    /// servers answer.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping it drops the half-made connections.
    pub async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        let servers = Arc::new(Servers::connect(config).await?);
        let grants = Grants::new(servers.clone());
        let shared = Shared::new(grants.clone());
        Ok(Self {
            waiting: Waiting::new(grants.clone()),
            renewal: Renewal::new(servers.clone()),
            sets: Sets::new(grants.clone()),
            admin: Admin::new(servers.clone(), shared.clone()),
            shared,
            grants,
            servers,
        })
    }

    /// What the connect-time check of the servers' `maxmemory-policy`
    /// found (see [`RedisConfig::eviction`]).
    pub fn eviction(&self) -> &EvictionCheck {
        &self.servers.eviction
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.servers.config
    }

    /// The TTL the configuration proposes (the URL's `ttl` option).
    pub fn default_ttl(&self) -> Duration {
        self.servers.config.default_ttl
    }

    /// How many renewals this backend (and its clones) sent, and in how many
    /// round trips (pipelines), summed over nodes.
    pub fn renewal_stats(&self) -> RedisRenewalStats {
        self.renewal.stats()
    }

    /// The deployment every component shares (the unit tests' switches).
    #[cfg(test)]
    pub(crate) fn servers(&self) -> &Arc<Servers> {
        &self.servers
    }

    /// The Redis key that holds the lock `key`, for other clients that want
    /// to exclude with ours: `<prefix>{<key>}` in the native layout,
    /// `<prefix><key>` (the key itself when no prefix was set) in the
    /// legacy layouts (see the crate docs, *Legacy layouts*).
    pub fn redis_key(&self, key: &LockKey) -> String {
        self.servers.keys.layout_names(key).lock
    }

    /// The `{...}` hash tag of the lock `key`'s Redis name (braces
    /// included), for naming data that a guarded script
    /// ([`run_guarded`](Self::run_guarded)) writes beside the lock: in
    /// Redis Cluster its keys must share the lock's slot, which any key
    /// containing this tag does (`format!("{tag}:balance")`). Always
    /// there in the native layout (`{<key>}`); in the legacy layouts only
    /// when the key (or the prefix) has one of its own. Pick names that
    /// are not the driver's own (`<prefix>{<key>}...`): without a
    /// prefix (`prefix=`) a name that starts with the tag could be one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let backend = lock_redis::connect("redis+cluster://127.0.0.1:7000").await?;
    /// let key = lock_core::LockKey::new("accounts/7")?;
    /// let tag = backend.hash_tag(&key).expect("the native layout tags every key");
    /// assert_eq!(tag, "{accounts/7}");
    /// let balance = format!("{tag}:balance");
    /// # let _ = balance; Ok(()) }
    /// ```
    pub fn hash_tag(&self, key: &LockKey) -> Option<String> {
        let lock = self.servers.keys.layout_names(key).lock;
        crate::guarded::hash_tag(&lock).map(str::to_owned)
    }

    /// Runs `script` (a caller's Lua body, with its `keys` and `args` as
    /// its `KEYS` and `ARGV`) on the lock's server only if `lease` still
    /// holds its lock: the server checks that the lock key holds the
    /// lease's owner, then runs the body, in one `EVALSHA` (atomic: no
    /// other command runs in between), so a write made this way never
    /// lands after the lease was released, expired or broken, and needs no
    /// fencing token at the resource. The data must live in the same
    /// Redis (in Cluster, in the lock's slot: see
    /// [`hash_tag`](Self::hash_tag)).
    ///
    /// Mutex leases of every layout (native, fair, `plain`, `redisson`)
    /// on one server, Sentinel and Cluster. What it does not promise: a
    /// failover to a replica that missed the grant or the release can
    /// admit a write the lock would refuse on the old master (as it can
    /// grant the key twice: see the crate docs, *Caveats*); a body that
    /// fails halfway keeps the writes it made before its error (Redis
    /// does not roll a script back); and a call resent after a lost
    /// answer (the Cluster client retries on a broken connection) can run
    /// the body twice while the lease holds, so prefer idempotent writes
    /// (`SET`, `HSET`) or guard them in the body.
    ///
    /// # Errors
    ///
    /// Every error reports [`Operation::GuardedWrite`]. Before anything is
    /// sent:
    /// [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported) on
    /// Redlock (no one server can check a majority's lock in the same step
    /// as a write) and for a read-write or semaphore lease;
    /// [`ErrorKind::InvalidArgument`](lock_core::ErrorKind::InvalidArgument)
    /// in Cluster for a key outside the lock's slot. Then:
    /// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) /
    /// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) when
    /// the server does not answer (whether the body ran is unknown);
    /// [`ErrorKind::Backend`](lock_core::ErrorKind::Backend) for a Lua
    /// error or an error reply of the body. A lease that no longer holds
    /// its lock is not an error: [`RedisGuardedReply::NotHeld`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the call was sent leaves it unknown
    /// whether the body ran; either way the check and the body ran
    /// together or not at all.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::{LockBackend, LockBackendExt, LockKey};
    /// use lock_redis::{RedisGuardedReply, RedisGuardedScript};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let backend = lock_redis::connect("redis://127.0.0.1:6379").await?;
    /// let key = LockKey::new("accounts/7")?;
    /// let balance = format!("{}:balance", backend.hash_tag(&key).unwrap());
    /// let set = RedisGuardedScript::new("return redis.call('SET', KEYS[1], ARGV[1])");
    /// let lease = backend.try_acquire(&key, Duration::from_secs(5)).await?.unwrap();
    /// let reply = backend.run_guarded(&lease, &set, &[&balance], &["40"]).await?;
    /// assert!(reply.is_ran());
    /// backend.release(&lease).await?;
    /// let late = backend.run_guarded(&lease, &set, &[&balance], &["41"]).await?;
    /// assert_eq!(late, RedisGuardedReply::NotHeld);
    /// # Ok(()) }
    /// ```
    ///
    /// [`Operation::GuardedWrite`]: lock_core::Operation::GuardedWrite
    /// [`RedisGuardedReply::NotHeld`]: crate::RedisGuardedReply::NotHeld
    pub async fn run_guarded(
        &self,
        lease: &Lease,
        script: &RedisGuardedScript,
        keys: &[&str],
        args: &[&str],
    ) -> Result<RedisGuardedReply, LockError> {
        crate::guarded::run(&self.servers, lease, script, keys, args).await
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
        capabilities(&self.servers.config)
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        let keys = &self.servers.keys;
        let shapes = "read-write locks and semaphores";
        match (kind, deadline) {
            // Boxed: the fair try's future is the largest of the mutex's,
            // and would set the size of every grant's future (the box of
            // this call, allocated and written on every grant).
            (LeaseKind::Exclusive, None) if self.servers.config.fair => {
                Box::pin(self.waiting.try_fair(key, ttl)).await
            }
            (LeaseKind::Exclusive, None) => self.grants.try_take(key, ttl).await,
            (LeaseKind::Exclusive, Some(deadline)) => {
                self.waiting.take(key, ttl, deadline).await.map(Some)
            }
            // The shared kinds' futures boxed: larger than the mutex's,
            // they would make every grant's future (copied whole into this
            // call's box) as large as theirs.
            (kind, None) => {
                keys.refuse_legacy(Operation::TryAcquire, shapes, key)?;
                Box::pin(self.shared.try_acquire(key, kind, ttl)).await
            }
            (kind, Some(deadline)) => {
                keys.refuse_legacy(Operation::Acquire, shapes, key)?;
                Box::pin(self.shared.acquire(key, kind, ttl, deadline))
                    .await
                    .map(Some)
            }
        }
    }

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        self.renewal.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        if lease.kind() == LeaseKind::Exclusive {
            self.grants.release(lease).await
        } else {
            // Boxed: larger than the mutex's, it would set the size of
            // every release's future (the box of this call).
            Box::pin(self.shared.release(lease)).await
        }
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        match shape {
            LockShape::Mutex => Ok(lock_core::kind::mutex_holders(
                self.grants.inspect(key).await?,
            )),
            shape => {
                self.servers.keys.refuse_legacy(
                    Operation::Inspect,
                    "read-write locks and semaphores",
                    key,
                )?;
                self.shared.holders(key, shape).await
            }
        }
    }

    /// Administration and holder watches everywhere; sets of keys in one
    /// script and downgrades where the layout and topology have them (not
    /// on Redlock, not in the legacy layouts: see the crate docs).
    /// Elections are the renewed mutex (lock-core's default), watched as
    /// its holder.
    fn facets(&self) -> Facets<'_> {
        let ours = !self.servers.redlock && !self.servers.keys.layout().is_legacy();
        Facets {
            listing: Some(&self.admin),
            admin: Some(&self.admin),
            lock_sets: ours.then_some(&self.sets as &dyn LockSets),
            downgrade: ours.then_some(&self.shared as &dyn lock_core::Downgrade),
            holder_watch: Some(self),
            ..Facets::default()
        }
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
        request: WatchRequest<'_, LockInfo>,
    ) -> Result<Option<LockInfo>, LockError> {
        if request.seen.is_none() {
            return lock_core::poll_holder(self, request).await;
        }
        let names = self.servers.keys.mutex(request.key, Operation::Inspect)?;
        let watch = self
            .servers
            .notifier
            .watch(&names.channel, request.deadline)
            .await;
        lock_core::watch_holder_with(self, request, || {
            // Registered before the read so a release in between wakes us.
            let mut notified = Box::pin(watch.notify().notified());
            notified.as_mut().enable();
            notified
        })
        .await
    }
}
