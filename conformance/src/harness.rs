//! What a case runs against: a target (a way to make clients and to break
//! things) plus timing settings and a random key namespace.

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
        }
    }
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
/// and "unreachable" is its [`MemoryFault::Hang`] switch (like SIGSTOP).
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
}
