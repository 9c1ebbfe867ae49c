//! `RedisBackend`: the `LockBackend` implementation for every topology.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    Capabilities, ErrorKind, FencingScope, FencingToken, Lease, LockBackend, LockError, LockInfo,
    LockKey, Operation, OwnerId, RetryPolicy, TtlModel, WaitStrategy, async_trait, check_ttl,
    random_delay, validity_deadline,
};
use redis::Value;
use tokio::time::{Instant, sleep_until};

use crate::batch::{Counters, Renewer};
use crate::config::{RedisConfig, RedisTopology};
use crate::conn::Node;
use crate::error::{NAME, still_held, unexpected};
use crate::eviction::{self, EvictionCheck};
use crate::notify::Notifier;
use crate::scripts::{KeyNames, Scripts, ttl_ms};

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
/// use lock_core::{LockBackend, LockKey};
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

/// What one acquire attempt found.
enum Attempt {
    Granted(Lease),
    /// Someone else holds the key; `retry_in` is when it expires at the
    /// latest (from its PTTL) or `None` when unknown. `split` says that a
    /// Redlock attempt won some nodes but not a majority.
    Held {
        retry_in: Option<Duration>,
        split: bool,
    },
}

/// What a waiting acquire does after an attempt.
enum Found {
    Granted(Lease),
    /// Wait (for a release notification, at most this long), then retry.
    Wait(Duration),
}

/// What one node said to an acquire script.
pub(crate) enum NodeGrant {
    Granted(u64),
    Held(i64),
}

pub(crate) fn parse_grant(value: &Value) -> Result<NodeGrant, LockError> {
    if let Value::Array(items) = value
        && let [Value::Int(flag), answer] = items.as_slice()
    {
        match (*flag, answer) {
            (1, Value::Int(n)) => {
                if let Ok(token) = u64::try_from(*n) {
                    return Ok(NodeGrant::Granted(token));
                }
            }
            // A retried acquire returns the counter as the string it stores.
            (1, Value::BulkString(bytes)) => {
                if let Some(token) = std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok())
                {
                    return Ok(NodeGrant::Granted(token));
                }
            }
            (0, Value::Int(n)) => return Ok(NodeGrant::Held(*n)),
            _ => {}
        }
    }
    Err(unexpected(Operation::Acquire, value))
}

pub(crate) fn as_int(value: &Value, op: Operation) -> Result<i64, LockError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(unexpected(op, other)),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// Releases a grant whose outcome we could not see (timeout, cancelled
/// future, expired on arrival, WAIT not satisfied) unless disarmed.
struct PendingGrant<'a> {
    inner: &'a Arc<Inner>,
    names: &'a KeyNames,
    owner: &'a str,
    armed: bool,
}

impl PendingGrant<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PendingGrant<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            let names = self.names.clone();
            let owner = self.owner.to_owned();
            handle.spawn(async move {
                let _ = inner
                    .release_all(&names, &owner, inner.config.operation_timeout)
                    .await;
            });
        }
    }
}

/// Runs `call` on every node: concurrently, or directly when there is one.
async fn each_node<'a, F, Fut, T>(nodes: &'a [Arc<Node>], mut call: F) -> Vec<T>
where
    F: FnMut(&'a Arc<Node>) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    if let [node] = nodes {
        vec![call(node).await]
    } else {
        futures_util::future::join_all(nodes.iter().map(call)).await
    }
}

/// Connects to the Redis deployment a URL names (see [`RedisConfig`] for the
/// forms).
///
/// # Errors
///
/// [`ErrorKind::Config`] for a bad URL; [`ErrorKind::Unavailable`] /
/// [`ErrorKind::Timeout`] when not enough servers answer.
///
/// # Cancel safety
///
/// Safe: dropping it drops the half-made connections.
pub async fn connect(url: &str) -> Result<RedisBackend, LockError> {
    RedisBackend::connect(RedisConfig::from_url(url)?).await
}

impl RedisBackend {
    /// Connects with `config`: opens the shared connection of each node and
    /// loads the scripts. Must be called within a Tokio runtime (the
    /// backend runs its pub/sub and renewal-batching tasks on it). Redlock needs a majority of its nodes to answer;
    /// the others are connected later, when they come back.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] for a bad configuration or wrong credentials;
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when not enough
    /// servers answer.
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping it drops the half-made connections.
    pub async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            // Its background tasks (pub/sub, renewal batches) need Tokio.
            return Err(
                LockError::config("the Redis backend needs a Tokio runtime").with_backend(NAME)
            );
        }
        let config = Arc::new(config);
        let nodes: Vec<Node> = match &config.topology {
            RedisTopology::Single(node) => vec![Node::direct(&config, node)?],
            RedisTopology::Sentinel { sentinels, master } => {
                vec![Node::sentinel(&config, sentinels, master)?]
            }
            RedisTopology::Cluster(seeds) => vec![Node::cluster(&config, seeds)?],
            RedisTopology::Redlock(nodes) => nodes
                .iter()
                .map(|n| Node::direct(&config, n))
                .collect::<Result<_, _>>()?,
        };
        let redlock = matches!(config.topology, RedisTopology::Redlock(_));
        let cluster = matches!(config.topology, RedisTopology::Cluster(_));
        if config.wait_replicas > 0 && (redlock || cluster) {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                Operation::Connect,
                "WAIT for replicas is supported with redis:// and redis+sentinel:// only",
            )
            .with_backend(NAME));
        }
        let nodes: Vec<Arc<Node>> = nodes.into_iter().map(Arc::new).collect();
        let scripts = Arc::new(Scripts::new());
        let renewers = nodes
            .iter()
            .map(|n| Renewer::new(n.clone(), scripts.clone()))
            .collect();
        let notifier = Notifier::new(&nodes, config.operation_timeout.min(Duration::from_secs(1)));
        let quorum = nodes.len() / 2 + 1;
        let mut inner = Inner {
            config: config.clone(),
            scripts,
            nodes,
            renewers,
            notifier,
            redlock,
            quorum,
            eviction: EvictionCheck::NoEviction,
        };
        // Connect and load the scripts (a cluster loads them per node on
        // first use, through the EVAL fallback).
        let loads = inner.nodes.iter().map(|node| {
            let scripts = inner.scripts.clone();
            node.run(
                Operation::Connect,
                config.operation_timeout,
                move |mut conn| async move {
                    if !matches!(conn, crate::conn::Conn::Cluster(_)) {
                        for script in scripts.all() {
                            let _: String = conn
                                .query(redis::cmd("SCRIPT").arg("LOAD").arg(script.code))
                                .await?;
                        }
                    } else {
                        let _: Value = conn.query(&redis::cmd("PING")).await?;
                    }
                    Ok(())
                },
            )
        });
        let results = futures_util::future::join_all(loads).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        if ok < inner.quorum {
            let err = results.into_iter().find_map(Result::err);
            return Err(err.unwrap_or_else(|| {
                LockError::new(
                    ErrorKind::Unavailable,
                    Operation::Connect,
                    "no node answered",
                )
            }));
        }
        // A server that may evict keys can delete a held lock or a token
        // counter: warn, or refuse when the configuration asks for it.
        let live: Vec<bool> = results.iter().map(Result::is_ok).collect();
        inner.eviction = eviction::check(&inner.nodes, &live, config.operation_timeout).await;
        eviction::apply(&inner.eviction, config.eviction)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

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

    /// The Redis key that holds the lock `key` (`<prefix>{<key>}`), for
    /// other clients that want to exclude with ours.
    pub fn redis_key(&self, key: &LockKey) -> String {
        KeyNames::new(&self.inner.config.prefix, key).lock
    }

    fn names(&self, key: &LockKey) -> KeyNames {
        KeyNames::new(&self.inner.config.prefix, key)
    }

    async fn attempt(
        &self,
        key: &LockKey,
        ttl: Duration,
        op: Operation,
        timeout: Duration,
    ) -> Result<Attempt, LockError> {
        let names = self.names(key);
        let owner = OwnerId::random();
        let owner_hex = owner.to_hex();
        let ttl_ms = ttl_ms(ttl);
        let pending = PendingGrant {
            inner: &self.inner,
            names: &names,
            owner: &owner_hex,
            armed: true,
        };
        let inner = &self.inner;
        let sent_at = Instant::now();
        let per_node = if inner.redlock {
            timeout.min((ttl / 10).max(Duration::from_millis(100)))
        } else {
            timeout
        };
        let results = each_node(&inner.nodes, |node| {
            let (names, owner_hex, ttl_ms) = (&names, &owner_hex, &ttl_ms);
            node.run(op, per_node, move |mut conn| async move {
                inner
                    .scripts
                    .call_acquire(&mut conn, names, owner_hex, ttl_ms)
                    .await
            })
        })
        .await;
        let mut tokens = Vec::new();
        let mut held_pttl: Option<Duration> = None;
        let mut errors = Vec::new();
        for result in results {
            match result.and_then(|v| parse_grant(&v)) {
                Ok(NodeGrant::Granted(token)) => tokens.push(token),
                Ok(NodeGrant::Held(ms)) => {
                    let left = pttl(ms).unwrap_or(Duration::ZERO);
                    held_pttl = Some(held_pttl.map_or(left, |p| p.min(left)));
                    if ms == -1 {
                        // A foreign holder without TTL: re-check at the interval.
                        held_pttl = Some(inner.config.recheck);
                    }
                }
                Err(err) => errors.push(err),
            }
        }
        if tokens.len() >= inner.quorum {
            // Redlock: the highest node counter is a hint, not a safe token.
            let token = tokens.iter().copied().max().unwrap_or(0);
            if inner.config.wait_replicas > 0
                && let Err(err) = self.wait_replicas(op, timeout).await
            {
                // `pending` releases the grant on drop.
                return Err(err.with_key(key));
            }
            let lease = Lease::granted(
                key.clone(),
                owner,
                FencingToken::new(token),
                ttl,
                sent_at,
                String::new(),
            )
            .map_err(|e| e.with_backend(NAME))?;
            pending.disarm();
            return Ok(Attempt::Granted(lease));
        }
        let split = !tokens.is_empty();
        if tokens.is_empty() && errors.is_empty() {
            // Nothing was set anywhere: nothing to undo.
            pending.disarm();
        } else {
            // Undo the partial grant now, on every node (also those whose
            // answer was lost), so no partial lock is left behind.
            let _ = inner.release_all(&names, &owner_hex, per_node).await;
            pending.disarm();
        }
        if errors.len() > inner.nodes.len() - inner.quorum {
            let err = errors.swap_remove(0);
            let err = if inner.redlock {
                LockError::new(
                    err.kind(),
                    op,
                    format!(
                        "only {} of {} Redlock nodes answered (a majority is needed): {}",
                        inner.nodes.len() - errors.len() - 1,
                        inner.nodes.len(),
                        err.message()
                    ),
                )
                .with_backend(NAME)
                .with_source(err)
            } else {
                err
            };
            return Err(err.with_key(key));
        }
        Ok(Attempt::Held {
            retry_in: held_pttl,
            split,
        })
    }

    async fn wait_replicas(&self, op: Operation, timeout: Duration) -> Result<(), LockError> {
        let config = &self.inner.config;
        let wanted = config.wait_replicas;
        let wait_ms = config.wait_timeout.as_millis().to_string();
        let node = &self.inner.nodes[0];
        let acked = node
            .run(
                op,
                timeout.max(config.wait_timeout * 2),
                |mut conn| async move {
                    conn.query::<i64>(redis::cmd("WAIT").arg(wanted).arg(&wait_ms))
                        .await
                },
            )
            .await?;
        if acked < i64::from(wanted) {
            return Err(LockError::new(
                ErrorKind::Unavailable,
                op,
                format!("only {acked} of {wanted} replicas acknowledged the grant; it was undone"),
            )
            .with_backend(NAME));
        }
        Ok(())
    }

    /// The bound of one attempt of a waiting acquire: the operation
    /// timeout, shortened near the deadline (but never below 100 ms).
    fn attempt_timeout(&self, deadline: Instant) -> Duration {
        let left = deadline.saturating_duration_since(Instant::now());
        self.inner
            .config
            .operation_timeout
            .min(left.max(Duration::from_millis(100)))
    }

    /// What a waiting acquire does after one attempt: return the lease,
    /// fail (a permanent error, or the deadline passed), or wait this long
    /// (at most) before the next attempt.
    fn found(
        &self,
        key: &LockKey,
        attempt: Result<Attempt, LockError>,
        deadline: Instant,
        errors: &mut Option<lock_core::Backoff>,
    ) -> Result<Found, LockError> {
        let config = &self.inner.config;
        match attempt {
            Ok(Attempt::Granted(lease)) => Ok(Found::Granted(lease)),
            Ok(Attempt::Held { retry_in, split }) => {
                if Instant::now() >= deadline {
                    return Err(still_held(key));
                }
                Ok(Found::Wait(if split {
                    // Redlock split vote: back off a random time so the
                    // contenders do not collide again.
                    random_delay(Duration::from_millis(30))
                } else {
                    // Expiry publishes nothing: re-check when the holder's
                    // TTL runs out, and at least every `recheck`.
                    retry_in
                        .map_or(config.recheck, |t| t + Duration::from_millis(1))
                        .min(config.recheck)
                }))
            }
            Err(err) if err.is_temporary() || err.is_lost() => {
                if Instant::now() >= deadline {
                    return Err(err);
                }
                let errors = errors.get_or_insert_with(|| {
                    RetryPolicy {
                        initial: Duration::from_millis(20),
                        max: Duration::from_millis(500),
                        multiplier: 2,
                        max_attempts: None,
                    }
                    .backoff()
                });
                Ok(Found::Wait(
                    errors.next_delay().unwrap_or(Duration::from_millis(500)),
                ))
            }
            Err(err) => Err(err),
        }
    }

    fn check_ttl(&self, ttl: Duration, op: Operation, key: &LockKey) -> Result<(), LockError> {
        check_ttl(ttl, MIN_TTL, op).map_err(|e| e.with_backend(NAME).with_key(key))
    }
}

impl Inner {
    /// Compare-and-delete on every node; `(released, not_held, errors)`.
    async fn release_all(
        &self,
        names: &KeyNames,
        owner: &str,
        timeout: Duration,
    ) -> (usize, usize, Vec<LockError>) {
        let results = each_node(&self.nodes, |node| {
            node.run(Operation::Release, timeout, move |mut conn| async move {
                self.scripts.call_release(&mut conn, names, owner).await
            })
        })
        .await;
        let mut released = 0;
        let mut not_held = 0;
        let mut errors = Vec::new();
        for result in results {
            match result.and_then(|v| as_int(&v, Operation::Release)) {
                Ok(1) => released += 1,
                Ok(_) => not_held += 1,
                Err(err) => errors.push(err),
            }
        }
        (released, not_held, errors)
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: if self.inner.redlock {
                FencingScope::None
            } else {
                FencingScope::PerKey
            },
            fencing_survives_failover: false,
            grants_survive_restart: false,
            waiting: WaitStrategy::Notify,
            fifo: false,
            ttl_model: TtlModel::PerLease,
            linearizable: false,
            min_ttl: MIN_TTL,
            ..Capabilities::minimal()
        }
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        let op = Operation::TryAcquire;
        self.check_ttl(ttl, op, key)?;
        match self
            .attempt(key, ttl, op, self.inner.config.operation_timeout)
            .await?
        {
            Attempt::Granted(lease) => Ok(Some(lease)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let op = Operation::Acquire;
        self.check_ttl(ttl, op, key)?;
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
        let names = self.names(key);
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
            let wake_at = (Instant::now() + wait).min(deadline);
            tokio::select! {
                () = &mut notified => {}
                () = sleep_until(wake_at) => {}
            }
            if Instant::now() >= deadline {
                return Err(still_held(key));
            }
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let op = Operation::Renew;
        let key = lease.key();
        self.check_ttl(lease.ttl(), op, key)?;
        let names = self.names(key);
        let owner = lease.owner().to_hex();
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
            let deadline = validity_deadline(sent_at, lease.ttl());
            if deadline > Instant::now() {
                return Ok(deadline);
            }
            return Err(LockError::new(
                ErrorKind::LeaseLost,
                op,
                "the renewal arrived after its validity deadline",
            )
            .with_backend(NAME)
            .with_key(key));
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

    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        // One pipeline per node for the whole batch (see renew_many.rs).
        self.renew_pipelined(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let names = self.names(lease.key());
        let owner = lease.owner().to_hex();
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

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Inspect;
        let names = self.names(key);
        let inner = &self.inner;
        let calls = inner.nodes.iter().map(|node| {
            let names = &names;
            node.run(
                op,
                inner.config.operation_timeout,
                move |mut conn| async move {
                    conn.eval(&inner.scripts.inspect, &[&names.lock, &names.counter], &[])
                        .await
                },
            )
        });
        let mut holders: Vec<(String, Option<Duration>, Option<u64>)> = Vec::new();
        let mut errors = Vec::new();
        let mut free = 0;
        for result in futures_util::future::join_all(calls).await {
            match result {
                Ok(Value::Array(items)) if items.is_empty() => free += 1,
                Ok(Value::Array(items)) if items.len() == 3 => {
                    let holder = text(&items[0]).unwrap_or_default();
                    let left = as_int(&items[1], op).ok().and_then(pttl);
                    let counter = text(&items[2]).and_then(|t| t.parse::<u64>().ok());
                    holders.push((holder, left, counter));
                }
                Ok(Value::Nil) => free += 1,
                Ok(other) => errors.push(unexpected(op, &other)),
                Err(err) => errors.push(err),
            }
        }
        if holders.len() + free < inner.quorum {
            let err = errors.into_iter().next().unwrap_or_else(|| {
                LockError::new(ErrorKind::Unavailable, op, "no majority answered")
                    .with_backend(NAME)
            });
            return Err(err.with_key(key));
        }
        // The holder is whoever holds it on a majority of nodes.
        for (holder, _, _) in &holders {
            let same: Vec<_> = holders.iter().filter(|(h, _, _)| h == holder).collect();
            if same.len() >= inner.quorum {
                let remaining = same.iter().filter_map(|(_, left, _)| *left).min();
                // Our holders store a 32-hex-digit owner id; then the counter
                // is their token. A foreign client's value tells nothing.
                let ours = OwnerId::from_hex(holder).is_ok();
                let token = if inner.redlock || !ours {
                    None
                } else {
                    same.first().and_then(|(_, _, c)| *c).map(FencingToken::new)
                };
                return Ok(Some(LockInfo {
                    key: key.clone(),
                    holder: holder.clone(),
                    token,
                    remaining_ttl: remaining,
                }));
            }
        }
        Ok(None)
    }
}
