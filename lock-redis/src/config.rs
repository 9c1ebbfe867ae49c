//! One configuration for every Redis topology, from a URL or a builder.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_core::LockError;
use lock_core::endpoint::{Endpoint, HostPort, Secret};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::keys::layout::{DEFAULT_TOKEN_SUFFIX, RedisLayout};

/// The shortest TTL accepted: below it the clock-drift allowance and one
/// round trip eat the whole lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The default key prefix (`distlock:`): a lock named `jobs/a` lives in the
/// Redis key `distlock:{jobs/a}`.
pub const DEFAULT_PREFIX: &str = "distlock:";

/// The default operation timeout: every single network call is bounded by it.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// The default TTL offered to callers that do not pick one ([`RedisConfig::default_ttl`]).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The default upper bound between two re-checks of a waiter that heard no
/// release notification (a holder's expiry publishes nothing).
pub const DEFAULT_RECHECK: Duration = Duration::from_millis(500);

/// The default number of multiplexed connections to a `redis://` server
/// ([`RedisConfig::connections`]; one per `redlock://` node).
pub const DEFAULT_CONNECTIONS: usize = 2;

/// The most multiplexed connections per server
/// ([`RedisConfig::connections`]).
pub const MAX_CONNECTIONS: usize = 64;

/// One Redis server address (`host`, `port`; `Display` brackets IPv6).
pub type RedisNode = HostPort;

/// Which Redis deployment the locks live in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisTopology {
    /// One server (`redis://`, `rediss://`).
    Single(RedisNode),
    /// A master found through Sentinel (`redis+sentinel://`); re-resolved
    /// after a failover.
    Sentinel {
        /// The sentinels to ask.
        sentinels: Vec<RedisNode>,
        /// The monitored master's name.
        master: String,
    },
    /// Redis Cluster (`redis+cluster://`): seed nodes.
    Cluster(Vec<RedisNode>),
    /// Redlock over independent servers (`redlock://`).
    Redlock(Vec<RedisNode>),
}

/// Everything a [`RedisBackend`](crate::RedisBackend) needs.
///
/// Built from a URL ([`RedisConfig::from_url`]) or with the builder methods.
/// Its `Debug` output never shows a password.
///
/// # URL forms
///
/// ```text
/// redis://[[user]:password@]host[:port][/db][?options]
/// rediss://...                                         (TLS)
/// redis+sentinel://[[user]:password@]s1[:port][,s2[:port]...]/master[/db][?options]
/// redis+cluster://[[user]:password@]n1[:port][,n2[:port]...][?options]
/// redlock://[[user]:password@]n1[:port],n2[:port],n3[:port][/db][?options]
/// ```
///
/// Options: `ttl` (default TTL), `prefix` (key prefix, no braces),
/// `timeout` (operation timeout), `replicas` (replicas to `WAIT` for after
/// acquire), `wait_timeout` (how long `WAIT` may block), `recheck` (the
/// longest a waiter goes without re-checking), `tls=true` (TLS for the
/// multi-node schemes), `sentinel_password` (for sentinels that require
/// one), `eviction=warn|refuse` (what to do when a server's
/// `maxmemory-policy` lets it evict keys, see
/// [`eviction`](Self::eviction)), `fair=true` (FIFO mutexes, see
/// [`fair`](Self::fair); not with `redlock://`), `layout=native|plain|redisson`
/// (the mutex's key layout, see [`layout`](Self::layout)), `token_suffix`
/// (a legacy layout's counter suffix, see [`token_suffix`](Self::token_suffix))
/// and `connections` (multiplexed connections per server, see
/// [`connections`](Self::connections)).
/// Durations are `250ms`, `2s`, `1m` (a unit is required).
///
/// TLS options (only with TLS, i.e. `rediss://`, `rediss+sentinel://` or
/// `tls=true`):
///
/// - `ca=/path/to/ca.pem`: trust the CA certificate(s) in this PEM file
///   *instead of* the system trust store (e.g. a private CA or a
///   self-signed server certificate). The file is read when the backend
///   connects; an unreadable or malformed file is a `Config` error. The
///   server's certificate must still match the host name or IP address in
///   the URL. Not available for `redis+cluster://` yet (not tested).
/// - `insecure=true`: **disables certificate and host name verification**
///   entirely: the connection is encrypted but not authenticated, so anyone
///   on the path can impersonate the server. For throwaway test setups
///   only; cannot be combined with `ca`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub(crate) topology: RedisTopology,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) sentinel_password: Option<String>,
    pub(crate) tls: bool,
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) tls_insecure: bool,
    pub(crate) db: i64,
    pub(crate) prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) wait_replicas: u32,
    pub(crate) wait_timeout: Duration,
    pub(crate) recheck: Duration,
    pub(crate) eviction: EvictionMode,
    pub(crate) fair: bool,
    pub(crate) layout: RedisLayout,
    pub(crate) token_suffix: String,
    /// Chosen by `connections` (else the topology's default, see
    /// [`connections_per_server`](RedisConfig::connections_per_server)).
    pub(crate) connections: Option<usize>,
    /// Whether the prefix was chosen (else it follows the layout: `distlock:`
    /// for native, nothing for the legacy layouts).
    pub(crate) prefix_explicit: bool,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |p: &Option<String>| p.as_ref().map(|_| "<redacted>");
        f.debug_struct("RedisConfig")
            .field("topology", &self.topology)
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("sentinel_password", &redacted(&self.sentinel_password))
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca)
            .field("tls_insecure", &self.tls_insecure)
            .field("db", &self.db)
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("operation_timeout", &self.operation_timeout)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("recheck", &self.recheck)
            .field("eviction", &self.eviction)
            .field("fair", &self.fair)
            .field("layout", &self.layout)
            .field("token_suffix", &self.token_suffix)
            .field("connections", &self.connections)
            .finish()
    }
}

impl RedisConfig {
    fn with_topology(topology: RedisTopology) -> Self {
        Self {
            topology,
            username: None,
            password: None,
            sentinel_password: None,
            tls: false,
            tls_ca: None,
            tls_insecure: false,
            db: 0,
            prefix: DEFAULT_PREFIX.to_owned(),
            default_ttl: DEFAULT_TTL,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(100),
            recheck: DEFAULT_RECHECK,
            eviction: EvictionMode::Warn,
            fair: false,
            layout: RedisLayout::Native,
            token_suffix: DEFAULT_TOKEN_SUFFIX.to_owned(),
            connections: None,
            prefix_explicit: false,
        }
    }

    /// One server.
    pub fn single(host: impl Into<String>, port: u16) -> Self {
        Self::with_topology(RedisTopology::Single(RedisNode::new(host, port)))
    }

    /// A master named `master`, found through `sentinels`.
    pub fn sentinel(sentinels: Vec<RedisNode>, master: impl Into<String>) -> Self {
        Self::with_topology(RedisTopology::Sentinel {
            sentinels,
            master: master.into(),
        })
    }

    /// A Redis Cluster reached through these seed nodes.
    pub fn cluster(seeds: Vec<RedisNode>) -> Self {
        Self::with_topology(RedisTopology::Cluster(seeds))
    }

    /// Redlock over these independent servers (an odd number, 3 or 5, is usual).
    pub fn redlock(nodes: Vec<RedisNode>) -> Self {
        Self::with_topology(RedisTopology::Redlock(nodes))
    }

    /// Parses a URL (see the type's documentation for the forms).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an unknown
    /// scheme, a bad host list, port, option or value. The message never
    /// contains the password.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::from_endpoint(Endpoint::parse(url)?)
    }

    /// The config of a parsed URL (what the facade hands the driver; see
    /// [`from_url`](Self::from_url) for the URL's form).
    ///
    /// # Errors
    ///
    /// As [`from_url`](Self::from_url).
    pub fn from_endpoint(url: Endpoint) -> Result<Self, LockError> {
        parse_url(url)
    }

    /// Sets the password (and optionally the ACL user name).
    #[must_use]
    pub fn password(mut self, username: Option<&str>, password: &str) -> Self {
        self.username = username.map(str::to_owned);
        self.password = Some(password.to_owned());
        self
    }

    /// Sets the password sentinels require (data nodes use [`password`](Self::password)).
    #[must_use]
    pub fn sentinel_password(mut self, password: &str) -> Self {
        self.sentinel_password = Some(password.to_owned());
        self
    }

    /// Uses TLS to every node.
    #[must_use]
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Trusts the CA certificate(s) in this PEM file instead of the system
    /// trust store (the `ca` URL option). Needs TLS; not for Cluster. The
    /// file is read when the backend connects.
    #[must_use]
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls_ca = Some(path.as_ref().to_path_buf());
        self
    }

    /// **Disables TLS certificate and host name verification** (the
    /// `insecure` URL option): the connection is encrypted but anyone on the
    /// path can impersonate the server. For throwaway test setups only.
    #[must_use]
    pub fn danger_accept_invalid_certs(mut self, insecure: bool) -> Self {
        self.tls_insecure = insecure;
        self
    }

    /// Selects a database (not for Cluster, which only has database 0).
    #[must_use]
    pub fn db(mut self, db: i64) -> Self {
        self.db = db;
        self
    }

    /// Sets the key prefix.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) when it contains
    /// `{` or `}` (the driver's hash tag follows the prefix) or a control
    /// character.
    pub fn prefix(mut self, prefix: &str) -> Result<Self, LockError> {
        check_prefix(prefix)?;
        self.prefix = prefix.to_owned();
        self.prefix_explicit = true;
        Ok(self)
    }

    /// The key layout of the mutex (the `layout` URL option):
    /// [`RedisLayout::Native`] (ours, the default), [`RedisLayout::Plain`]
    /// (`SET <key> <owner> NX PX` at exactly the key: redis-py `Lock`,
    /// redsync, node-redlock) or [`RedisLayout::Redisson`] (Redisson's
    /// `RLock` hash). The legacy layouts add no hash tag and no default
    /// prefix (a [`prefix`](Self::prefix) set before or after is prepended
    /// verbatim), have the mutex only (no fair mode, read-write locks,
    /// semaphores or one-script sets) and keep the fencing counter at
    /// `<key>` + [`token_suffix`](Self::token_suffix). See the crate docs,
    /// *Legacy layouts*.
    #[must_use]
    pub fn layout(mut self, layout: RedisLayout) -> Self {
        self.layout = layout;
        if !self.prefix_explicit {
            self.prefix = if layout.is_legacy() {
                String::new()
            } else {
                DEFAULT_PREFIX.to_owned()
            };
        }
        self
    }

    /// The suffix of a legacy layout's fencing counter key (the
    /// `token_suffix` URL option; `:token` by default, so the counter of
    /// `jobs` is `jobs:token`).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) when it is empty,
    /// longer than 128 bytes or has a control character. With
    /// `layout=native` only the default is accepted (checked at connect).
    pub fn token_suffix(mut self, suffix: &str) -> Result<Self, LockError> {
        check_token_suffix(suffix)?;
        self.token_suffix = suffix.to_owned();
        Ok(self)
    }

    /// The key layout ([`layout`](Self::layout)).
    pub fn key_layout(&self) -> RedisLayout {
        self.layout
    }

    /// The legacy layouts' counter suffix ([`token_suffix`](Self::token_suffix)).
    pub fn counter_suffix(&self) -> &str {
        &self.token_suffix
    }

    /// Sets the TTL offered to callers that do not choose one.
    #[must_use]
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Sets the timeout of every single network call.
    #[must_use]
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// After each acquire, `WAIT`s for `replicas` replicas to acknowledge it
    /// for at most `timeout`; an acquire that fewer replicas acknowledged is
    /// undone and fails with `Unavailable`.
    #[must_use]
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = replicas;
        self.wait_timeout = timeout;
        self
    }

    /// Sets the longest time a waiter goes without re-checking the key when
    /// no release notification arrives.
    #[must_use]
    pub fn recheck_interval(mut self, interval: Duration) -> Self {
        self.recheck = interval;
        self
    }

    /// What to do at connect when a server may evict keys
    /// (`maxmemory-policy` other than `noeviction`; the `eviction` URL
    /// option): [`EvictionMode::Warn`] (the default) logs a warning,
    /// [`EvictionMode::Refuse`] fails the connect with a `Config` error. Use
    /// `Refuse` when you rely on fencing tokens or on mutual exclusion for
    /// correctness. A server whose `CONFIG` command is disabled or renamed
    /// cannot be checked: a warning either way.
    #[must_use]
    pub fn eviction(mut self, mode: EvictionMode) -> Self {
        self.eviction = mode;
        self
    }

    /// Fair (FIFO) mutexes (the `fair=true` URL option): waiting acquires
    /// queue per key in arrival order and only the queue's head is granted
    /// a free key; a `try_acquire` of a key with waiters is refused (no
    /// jumping the queue). Every waiter's queue entry has a short lease of
    /// its own (at most the lock's TTL and three `recheck` intervals,
    /// refreshed while it waits), so a waiter that died is skipped once
    /// that lease ends. One server, Sentinel and Cluster; Redlock refuses
    /// it (`Unsupported` at connect). See the crate docs, *Fair mode*.
    #[must_use]
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Sets how many multiplexed connections the client keeps to each
    /// server (the `connections` URL option; 1 to [`MAX_CONNECTIONS`]):
    /// `redis://` by default [`DEFAULT_CONNECTIONS`], each `redlock://`
    /// node by default 1 (its calls already go to several servers at
    /// once, and more connections per node measured slower). The calls
    /// about one grant go on the connection its owner value picks, in
    /// order: the grant, its `WAIT`, the undo of a grant whose answer was
    /// not seen (a cancelled or timed-out acquire), a waiter's withdrawal
    /// and the release are processed in the order they were sent; other
    /// calls go on the next connection in turn (renewal batches on the
    /// first). Several connections let the server read several tasks'
    /// requests at once where one connection alternates with the client
    /// in waves. Sentinel and Cluster keep one connection (the cluster
    /// client has its own per node; two connections must never end up
    /// on two masters after a failover): more is a `Config` error there.
    #[must_use]
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = Some(connections);
        self
    }

    /// How many multiplexed connections the client keeps to each server
    /// ([`connections`](Self::connections), else the topology's default).
    pub fn connections_per_server(&self) -> usize {
        match (&self.topology, self.connections) {
            (_, Some(chosen)) => chosen,
            (RedisTopology::Single(_), None) => DEFAULT_CONNECTIONS,
            (_, None) => 1,
        }
    }

    /// Whether mutexes are fair ([`fair`](Self::fair)).
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// The eviction mode ([`eviction`](Self::eviction)).
    pub fn eviction_mode(&self) -> EvictionMode {
        self.eviction
    }

    /// The topology.
    pub fn topology(&self) -> &RedisTopology {
        &self.topology
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The TTL from the URL's `ttl` option (30 s when absent).
    pub fn ttl(&self) -> Duration {
        self.default_ttl
    }

    /// The operation timeout.
    pub fn timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// How many replicas an acquire waits for.
    pub fn replicas(&self) -> u32 {
        self.wait_replicas
    }

    /// Whether the data connections use TLS (`rediss://`, `tls=true`).
    pub fn uses_tls(&self) -> bool {
        self.tls
    }

    /// The redis crate's settings of the data connection the driver opens
    /// to one server: the operation timeout to connect, and as each
    /// request's response timeout (the crate's own per-request bound: the
    /// driver sets no timer of its own around a single request, see
    /// `docs/backends/redis.md`). Public so that a comparison with the
    /// redis crate alone (`lock-bench`, `distlock-compare`) opens the same
    /// connection: `redis::Client::get_multiplexed_async_connection_with_config`.
    pub fn connection_config(&self) -> redis::AsyncConnectionConfig {
        conn_config(self.operation_timeout)
    }

    /// The database number (`SELECT`) of the data connections.
    pub fn database(&self) -> i64 {
        self.db
    }

    /// The user name and password the data connections `AUTH` with.
    pub fn credentials(&self) -> (Option<&str>, Option<&str>) {
        (self.username.as_deref(), self.password.as_deref())
    }

    /// Checks the settings together (what [`RedisBackend::connect`]
    /// checks first): the nodes, prefix, layout, timeouts, TTL and TLS
    /// options.
    ///
    /// [`RedisBackend::connect`]: crate::RedisBackend::connect
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) or
    /// [`ErrorKind::Unsupported`](lock_core::ErrorKind::Unsupported) for
    /// settings that do not go together.
    pub fn validate(&self) -> Result<(), LockError> {
        let nodes: &[RedisNode] = match &self.topology {
            RedisTopology::Single(node) => std::slice::from_ref(node),
            RedisTopology::Sentinel { sentinels, master } => {
                if master.is_empty() {
                    return Err(LockError::config("the sentinel master name is empty"));
                }
                sentinels
            }
            RedisTopology::Cluster(nodes) => {
                if self.db != 0 {
                    return Err(LockError::config("Redis Cluster only has database 0"));
                }
                nodes
            }
            RedisTopology::Redlock(nodes) => nodes,
        };
        if nodes.is_empty() {
            return Err(LockError::config("no Redis node given"));
        }
        if nodes.iter().any(|n| n.host.is_empty()) {
            return Err(LockError::config("empty host name"));
        }
        check_prefix(&self.prefix)?;
        check_token_suffix(&self.token_suffix)?;
        self.validate_layout()?;
        if self.operation_timeout.is_zero() {
            return Err(LockError::config("the operation timeout must be positive"));
        }
        if self.recheck.is_zero() {
            return Err(LockError::config("the recheck interval must be positive"));
        }
        if self.default_ttl.is_zero() || self.default_ttl > lock_core::MAX_TTL {
            return Err(LockError::config("the default TTL is out of range"));
        }
        if !self.tls && (self.tls_ca.is_some() || self.tls_insecure) {
            return Err(LockError::config(
                "the ca and insecure options need TLS (rediss:// or tls=true)",
            ));
        }
        if self.tls_ca.is_some() && self.tls_insecure {
            return Err(LockError::config(
                "the ca and insecure options cannot be combined",
            ));
        }
        if self.tls_ca.is_some() && matches!(self.topology, RedisTopology::Cluster(_)) {
            return Err(LockError::config(
                "the ca option is not supported for redis+cluster:// yet",
            ));
        }
        let connections = self.connections_per_server();
        if connections == 0 || connections > MAX_CONNECTIONS {
            return Err(LockError::config(format!(
                "connections must be 1 to {MAX_CONNECTIONS}, not {connections}"
            )));
        }
        if connections > 1
            && matches!(
                self.topology,
                RedisTopology::Sentinel { .. } | RedisTopology::Cluster(_)
            )
        {
            return Err(LockError::config(
                "connections above 1 are for redis:// and redlock:// only (Sentinel and Cluster \
                 keep one connection)",
            ));
        }
        if self.wait_replicas > 0 && self.wait_timeout.is_zero() {
            return Err(LockError::config("wait_timeout must be positive"));
        }
        if self.fair && matches!(self.topology, RedisTopology::Redlock(_)) {
            return Err(LockError::new(
                lock_core::ErrorKind::Unsupported,
                lock_core::Operation::Connect,
                "fair=true is not available on Redlock: independent nodes keep independent \
                 queues, so no node's order is the order of the majority",
            )
            .with_backend(crate::error::NAME));
        }
        Ok(())
    }

    /// What a legacy layout cannot be combined with.
    fn validate_layout(&self) -> Result<(), LockError> {
        let layout = self.layout;
        if !layout.is_legacy() {
            if self.token_suffix != DEFAULT_TOKEN_SUFFIX {
                return Err(LockError::config(
                    "token_suffix applies to layout=plain and layout=redisson only (the native \
                     counter is <prefix>{<key>}:token)",
                ));
            }
            return Ok(());
        }
        let unsupported = |message: String| {
            Err(LockError::new(
                lock_core::ErrorKind::Unsupported,
                lock_core::Operation::Connect,
                message,
            )
            .with_backend(crate::error::NAME))
        };
        if self.fair {
            return unsupported(format!(
                "fair=true needs layout=native: the other clients of layout={} do not see \
                 our queue",
                layout.as_str()
            ));
        }
        if layout == RedisLayout::Redisson && matches!(self.topology, RedisTopology::Redlock(_)) {
            return unsupported(
                "layout=redisson is not available on Redlock (use one server, Sentinel or \
                 Cluster, as Redisson's RLock does)"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// A URL for the redis crate for one data node (credentials percent-encoded).
    pub(crate) fn node_url(&self, node: &RedisNode) -> String {
        self.url_for(
            node,
            self.username.as_deref(),
            self.password.as_deref(),
            self.db,
        )
    }

    /// A URL for one sentinel.
    pub(crate) fn sentinel_url(&self, node: &RedisNode) -> String {
        self.url_for(node, None, self.sentinel_password.as_deref(), 0)
    }

    fn url_for(
        &self,
        node: &RedisNode,
        username: Option<&str>,
        password: Option<&str>,
        db: i64,
    ) -> String {
        use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
        let scheme = if self.tls { "rediss" } else { "redis" };
        let auth = match password {
            Some(password) => format!(
                "{}:{}@",
                utf8_percent_encode(username.unwrap_or(""), NON_ALPHANUMERIC),
                utf8_percent_encode(password, NON_ALPHANUMERIC)
            ),
            None => String::new(),
        };
        let fragment = if self.tls && self.tls_insecure {
            "#insecure"
        } else {
            ""
        };
        format!("{scheme}://{auth}{node}/{db}{fragment}")
    }

    /// The custom trust roots (`ca` option), read from their file now.
    pub(crate) fn tls_certificates(&self) -> Result<Option<redis::TlsCertificates>, LockError> {
        let Some(path) = &self.tls_ca else {
            return Ok(None);
        };
        let pem = std::fs::read(path).map_err(|err| {
            LockError::config(format!("cannot read the CA file {}: {err}", path.display()))
        })?;
        // Checked here because rustls skips text that is not PEM: a file
        // without a certificate would trust nothing and fail every
        // handshake as an unknown issuer, naming neither the file nor why.
        let certificates = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| {
                LockError::config(format!("malformed CA file {}: {err}", path.display()))
            })?;
        if certificates.is_empty() {
            return Err(LockError::config(format!(
                "the CA file {} holds no PEM certificate",
                path.display()
            )));
        }
        Ok(Some(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        }))
    }

    /// Secrets to scrub from any text that reaches an error message.
    pub(crate) fn secrets(&self) -> Vec<String> {
        [&self.password, &self.sentinel_password]
            .into_iter()
            .flatten()
            .filter(|p| !p.is_empty())
            .cloned()
            .collect()
    }
}

fn check_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
        return Err(LockError::config(
            "the key prefix must not contain '{', '}' or control characters",
        ));
    }
    if prefix.len() > 128 {
        return Err(LockError::config("the key prefix is longer than 128 bytes"));
    }
    Ok(())
}

fn check_token_suffix(suffix: &str) -> Result<(), LockError> {
    if suffix.is_empty() || suffix.len() > 128 || suffix.chars().any(char::is_control) {
        return Err(LockError::config(
            "token_suffix must be 1 to 128 bytes without control characters",
        ));
    }
    Ok(())
}

fn parse_url(mut url: Endpoint) -> Result<RedisConfig, LockError> {
    let scheme = url.scheme().to_owned();
    let segments = url.path_segments()?;
    let mut segments = segments.iter().map(String::as_str);
    let parse_db = |segment: Option<&str>| -> Result<i64, LockError> {
        match segment {
            None => Ok(0),
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| LockError::config("bad database number in the URL path")),
        }
    };
    let mut config = match scheme.as_str() {
        "redis" | "rediss" => {
            let [node] = <[RedisNode; 1]>::try_from(url.hosts(Some(6379))?).map_err(|_| {
                LockError::config(format!(
                    "{scheme}:// takes one host; use redlock:// or redis+cluster:// for several"
                ))
            })?;
            let mut config = RedisConfig::single(node.host, node.port);
            config.tls = scheme == "rediss";
            config.db = parse_db(segments.next())?;
            config
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let sentinels = url.hosts(Some(26379))?;
            let master = segments.next().ok_or_else(|| {
                LockError::config("redis+sentinel:// needs the master name as its path")
            })?;
            let mut config = RedisConfig::sentinel(sentinels, master);
            config.tls = scheme.starts_with("rediss");
            config.db = parse_db(segments.next())?;
            config
        }
        "redis+cluster" | "rediss+cluster" => {
            let mut config = RedisConfig::cluster(url.hosts(Some(6379))?);
            config.tls = scheme.starts_with("rediss");
            config
        }
        "redlock" => {
            let mut config = RedisConfig::redlock(url.hosts(Some(6379))?);
            config.db = parse_db(segments.next())?;
            config
        }
        other => {
            return Err(LockError::config(format!(
                "unknown scheme {other:?}: expected redis, rediss, redis+sentinel, redis+cluster or redlock"
            )));
        }
    };
    if segments.next().is_some() {
        return Err(LockError::config("unexpected path segments in the URL"));
    }
    match url.take_credentials() {
        // `redis://secret@host`: Redis's own convention reads a bare
        // userinfo as the password (AUTH without a user name).
        (Some(user), None) => config.password = Some(user),
        (user, password) => {
            config.username = user;
            config.password = password.map(Secret::into_inner);
        }
    }
    let options = url.options();
    options.alias("operation_timeout", "timeout")?;
    options.alias("wait_replicas", "replicas")?;
    options.alias("tls_ca", "ca")?;
    if let Some(ttl) = options.duration("ttl")? {
        config.default_ttl = ttl;
    }
    if let Some(layout) = options.text("layout")? {
        let layout = RedisLayout::parse(&layout).ok_or_else(|| {
            LockError::config(format!(
                "option layout: bad value {layout:?} (native, plain or redisson)"
            ))
        })?;
        config = config.layout(layout);
    }
    if let Some(prefix) = options.text("prefix")? {
        config = config.prefix(&prefix)?;
    }
    if let Some(suffix) = options.text("token_suffix")? {
        config = config.token_suffix(&suffix)?;
    }
    if let Some(timeout) = options.duration("timeout")? {
        config.operation_timeout = timeout;
    }
    if let Some(replicas) = options.number("replicas")? {
        config.wait_replicas = replicas;
    }
    if let Some(timeout) = options.duration("wait_timeout")? {
        config.wait_timeout = timeout;
    }
    if let Some(recheck) = options.duration("recheck")? {
        config.recheck = recheck;
    }
    if let Some(tls) = options.flag("tls")? {
        config.tls = tls;
    }
    if let Some(password) = options.secret("sentinel_password")? {
        config.sentinel_password = Some(password.into_inner());
    }
    if let Some(mode) = options.text("eviction")? {
        config.eviction = EvictionMode::parse(&mode).ok_or_else(|| {
            LockError::config(format!(
                "option eviction: bad value {mode:?} (warn or refuse)"
            ))
        })?;
    }
    if let Some(ca) = options.path("ca")? {
        config.tls_ca = Some(ca);
    }
    if let Some(insecure) = options.flag("insecure")? {
        config.tls_insecure = insecure;
    }
    if let Some(fair) = options.flag("fair")? {
        config.fair = fair;
    }
    if let Some(connections) = options.number("connections")? {
        config.connections = Some(connections);
    }
    options.finish("redis")?;
    config.validate()?;
    Ok(config)
}

/// What [`RedisConfig::eviction`] asks the
/// connect-time eviction check to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionMode {
    /// Log a `tracing` warning when a server may evict keys (the default).
    #[default]
    Warn,
    /// Refuse to connect (a `Config` error) when a server may evict keys.
    /// A server whose `CONFIG` command is disabled or renamed cannot be
    /// checked: that is a warning, never a refusal.
    Refuse,
}

impl EvictionMode {
    /// Parses the `eviction` URL option: `warn` or `refuse`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "warn" => Some(Self::Warn),
            "refuse" => Some(Self::Refuse),
            _ => None,
        }
    }
}

/// The settings of every data connection: `timeout` to connect and as
/// each request's response timeout (the redis crate's own per-request
/// bound, which it sets by default too, to 500 ms). `Node::run` and
/// `Node::run_request` set the latter per call on their handle.
pub(crate) fn conn_config(timeout: Duration) -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
}

#[cfg(test)]
mod tests;
