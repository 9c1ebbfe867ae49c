//! What a case runs against: a target (a way to make clients and to break
//! things) plus timing settings and a random key namespace.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, LockBackend, LockError, LockKey, MemoryBackend, MemoryFault, OwnerId,
};

use crate::process::HarnessError;

/// A backend under test.
///
/// Implemented once per driver (in its tests) and by [`MemoryTarget`].
#[async_trait]
pub trait Target: Send + Sync {
    /// A name for reports (`"memory"`, `"redis"`, `"postgres"`).
    fn name(&self) -> String;

    /// A new client, as an independent process would have: its own
    /// connection or session where the backend has one.
    ///
    /// # Errors
    ///
    /// Connection errors.
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError>;

    /// Makes the backend unreachable for every client (pause the server
    /// with SIGSTOP, cut a proxy, set a fault switch). Returns `Ok(false)`
    /// when this target cannot, and the cases that need it are skipped.
    ///
    /// # Errors
    ///
    /// When the fault cannot be injected.
    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        Ok(false)
    }

    /// Undoes [`make_unreachable`](Self::make_unreachable).
    ///
    /// # Errors
    ///
    /// When the fault cannot be removed.
    async fn heal(&self) -> Result<(), HarnessError> {
        Ok(())
    }

    /// The URL of the backend, for clients in other processes (the crash
    /// scenarios run `distlock` holders). `None` when it has none.
    fn url(&self) -> Option<String> {
        None
    }

    /// Kills the server with SIGKILL and starts it again on the same port
    /// and data. Returns `Ok(false)` when this target cannot.
    ///
    /// # Errors
    ///
    /// When the server cannot be restarted.
    async fn kill_and_restart_server(&self) -> Result<bool, HarnessError> {
        Ok(false)
    }

    /// A new client that reaches the backend through a fault proxy, with the
    /// proxy; `None` when this target cannot.
    ///
    /// # Errors
    ///
    /// When the proxy or the client cannot be set up.
    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, crate::proxy::FaultProxy)>, HarnessError> {
        Ok(None)
    }

    /// Makes the primary stop replicating to its replicas from now until
    /// the next [`fail_over`](Self::fail_over): writes are still
    /// acknowledged, but a failover will lose them, as with asynchronous
    /// replication lagging behind. Returns `Ok(false)` when the target has
    /// no asynchronous replication to hold back (a consensus cluster, a
    /// single server).
    ///
    /// # Errors
    ///
    /// When the fault cannot be injected.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled midway, replication may stay held until
    /// the next [`fail_over`](Self::fail_over).
    async fn hold_replication(&self) -> Result<bool, HarnessError> {
        Ok(false)
    }

    /// Kills the primary (the Redis master, the etcd or ZooKeeper leader)
    /// with SIGKILL and makes another node take over (promotes a replica,
    /// waits for an election), so that clients made by
    /// [`client`](Self::client) from now on talk to the new primary.
    /// Returns `Ok(false)` when this target cannot.
    ///
    /// Nodes it killed are started again by
    /// [`restart_nodes`](Self::restart_nodes) (or by the failover itself,
    /// as a replica of the new primary, where that is how the deployment
    /// recovers).
    ///
    /// # Errors
    ///
    /// When the failover cannot be carried out.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled midway, the deployment may be left with
    /// the primary killed and no successor; call
    /// [`restart_nodes`](Self::restart_nodes).
    async fn fail_over(&self) -> Result<bool, HarnessError> {
        Ok(false)
    }

    /// The number of nodes of a quorum deployment (every grant needs a
    /// majority of them: an etcd cluster, a ZooKeeper ensemble, Redlock's
    /// independent servers), or `None` when the target is not one.
    fn cluster_size(&self) -> Option<usize> {
        None
    }

    /// Kills `n` of the cluster's nodes with SIGKILL (the leader first,
    /// where there is one) and returns `Some(total)`, the number of nodes
    /// of the cluster; `Ok(None)` when this target cannot.
    ///
    /// # Errors
    ///
    /// When `n` exceeds the running nodes, or a node cannot be killed.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled midway, some nodes may be down; call
    /// [`restart_nodes`](Self::restart_nodes).
    async fn stop_nodes(&self, n: usize) -> Result<Option<usize>, HarnessError> {
        let _ = n;
        Ok(None)
    }

    /// Starts again, on their ports and data, the nodes that
    /// [`stop_nodes`](Self::stop_nodes) or [`fail_over`](Self::fail_over)
    /// killed, and waits until the cluster serves. Does nothing when none
    /// is down.
    ///
    /// # Errors
    ///
    /// When a node does not come back.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled midway, some nodes may still be down;
    /// calling it again restarts them.
    async fn restart_nodes(&self) -> Result<(), HarnessError> {
        Ok(())
    }

    /// For a deployment of one primary and peers that watch it (Redis
    /// Sentinel: the master, its replica and the sentinels, in the order
    /// of a lab's server hosts), the index of the current primary in that
    /// order: the member a kernel-partition soak cuts from the others, and
    /// after whose heal it waits in [`restart_nodes`](Self::restart_nodes)
    /// until the deployment has recovered. `None` for the other targets.
    ///
    /// # Cancel safety
    ///
    /// Safe: it only looks.
    async fn primary_member(&self) -> Option<usize> {
        None
    }
}

/// Timing and scale of the suite. Defaults suit a loopback server on a
/// shared two-core machine; margins absorb scheduling noise, never hide a
/// violation (violations are checked from the recorded history).
#[derive(Clone, Copy, Debug)]
pub struct SuiteConfig {
    /// TTL used by the cases (raised to the backend's minimum).
    pub ttl: Duration,
    /// Allowed lateness for "within X" checks (expiry, deadline, lost).
    pub margin: Duration,
    /// Tasks in the contention cases.
    pub tasks: usize,
    /// Lock/unlock iterations per task in the mutual-exclusion case.
    pub iterations: usize,
    /// Contended grants in the fencing-token case (at least 1,000).
    pub fencing_grants: usize,
    /// Independent clients the contention cases spread their tasks over.
    pub clients: usize,
    /// Upper bound on one case's run time.
    pub case_timeout: Duration,
    /// How long the looping cases run (the multi-lock deadlock loop, the
    /// election loop): 3 s by default, `DISTLOCK_LOOP_SECS` seconds when
    /// set (the long run uses 30).
    pub loop_run: Duration,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(1),
            margin: Duration::from_millis(500),
            tasks: 8,
            iterations: 25,
            fencing_grants: 1000,
            clients: 2,
            case_timeout: Duration::from_secs(120),
            loop_run: loop_run_from_env(),
        }
    }
}

/// `DISTLOCK_LOOP_SECS` (whole seconds, at most 600), else 3 s.
fn loop_run_from_env() -> Duration {
    std::env::var("DISTLOCK_LOOP_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(3), |s| {
            Duration::from_secs(s.clamp(1, 600))
        })
}

/// A target plus settings and a namespace unique to this run.
#[derive(Clone)]
pub struct Harness {
    target: Arc<dyn Target>,
    config: SuiteConfig,
    namespace: String,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("target", &self.target.name())
            .field("config", &self.config)
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Harness {
    /// A harness with default settings and a random namespace.
    pub fn new(target: Arc<dyn Target>) -> Self {
        Self::with_config(target, SuiteConfig::default())
    }

    /// A harness with explicit settings.
    pub fn with_config(target: Arc<dyn Target>, config: SuiteConfig) -> Self {
        let namespace = format!("t{}", &OwnerId::random().to_hex()[..10]);
        Self {
            target,
            config,
            namespace,
        }
    }

    /// The target.
    pub fn target(&self) -> &Arc<dyn Target> {
        &self.target
    }

    /// The settings.
    pub fn config(&self) -> &SuiteConfig {
        &self.config
    }

    /// A key unique to this run: `<namespace>/<name>`.
    ///
    /// # Panics
    ///
    /// Never for the short names cases use (validated anyway).
    pub fn key(&self, name: &str) -> LockKey {
        LockKey::new(format!("{}/{name}", self.namespace)).expect("case keys are valid")
    }

    /// A new client of the target.
    ///
    /// # Errors
    ///
    /// Connection errors.
    pub async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        self.target.client().await
    }

    /// The TTL cases use with `caps`: the configured one, raised to the
    /// backend's minimum.
    pub fn ttl_for(&self, caps: &Capabilities) -> Duration {
        self.config.ttl.max(caps.min_ttl)
    }
}

/// The in-memory backend as a target: clients are handles to one service,
/// "unreachable" is its [`MemoryFault::Hang`] switch (like SIGSTOP), and a
/// proxied client reaches it through an in-process
/// [`FaultLink`](crate::link::FaultLink).
#[derive(Clone, Debug)]
pub struct MemoryTarget {
    backend: MemoryBackend,
}

impl MemoryTarget {
    /// A fresh in-memory service whose injected hangs last 1 s.
    pub fn new() -> Self {
        Self {
            backend: MemoryBackend::with_op_timeout(Duration::from_secs(1)),
        }
    }

    /// The service.
    pub fn backend(&self) -> &MemoryBackend {
        &self.backend
    }
}

impl Default for MemoryTarget {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Target for MemoryTarget {
    fn name(&self) -> String {
        "memory".to_owned()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(self.backend.clone()))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        self.backend.set_fault(MemoryFault::Hang);
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        self.backend.set_fault(MemoryFault::None);
        Ok(())
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, crate::proxy::FaultProxy)>, HarnessError> {
        Ok(Some(crate::proxy::FaultProxy::in_process(
            Arc::new(self.backend.clone()),
            Duration::from_secs(1),
        )))
    }
}

/// Opens a backend from a URL (the facade's `distlock::backend::open`, injected so
/// that this crate stays independent of the drivers).
pub type Opener = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<Arc<dyn LockBackend>, LockError>> + Send>>
        + Send
        + Sync,
>;

/// A suite target of clients opened on one URL, with no deployment to
/// pause, restart or proxy (the cases needing one skip themselves): a
/// server started by the test itself (in a lab's namespace, say), or a
/// layout or mode of a deployed server.
pub struct UrlTarget {
    /// The name in reports.
    pub name: String,
    /// What every client is opened on.
    pub url: String,
    /// How each client is opened from `url`.
    pub open: Opener,
}

#[async_trait]
impl Target for UrlTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        (self.open)(self.url.clone()).await
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}
