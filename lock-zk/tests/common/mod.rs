//! The ZooKeeper targets of the shared suite and scenarios (deployments
//! from `conformance::deploy`, opened with this driver), and a standalone
//! server for the fault tests.

#![allow(dead_code, unreachable_pub)]

pub mod routed;

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::deploy::{self, DeployedTarget, Deployment, Opener};
use conformance::process::HarnessError;
use lock_core::{Lease, LeaseKind, LockBackend, LockBackendExt, LockError, LockKey, OwnerId};
use lock_zk::{ZkBackend, ZkConfig};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// The TTL of the leases the interop and shared-kind tests take.
pub const TTL: Duration = Duration::from_secs(3);

/// A key of its own for each run: `name` and a random suffix.
pub fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{}", &OwnerId::random().to_hex()[..8])).expect("key")
}

/// A 32-digit owner hex as a UUID (8-4-4-4-12), as Curator's node names
/// carry it.
pub fn dashed(hex: &str) -> String {
    OwnerId::from_hex(hex).expect("an owner hex").to_uuid()
}

/// `count` of `limit` permits.
pub fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).expect("permits")
}

/// A deadline `ms` milliseconds from now.
pub fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// A lease of `kind` on `k` (TTL [`TTL`]) by a single try that must be
/// granted; `what` names it when it is not.
pub async fn take(b: &ZkBackend, k: &LockKey, kind: LeaseKind, what: &str) -> Lease {
    b.try_acquire_kind(k, kind, TTL).await.unwrap().expect(what)
}

/// A mutex lease on `k` by a single try that must be granted (`what`
/// names it when it is not).
pub async fn grant(b: &ZkBackend, k: &LockKey, ttl: Duration, what: &str) -> Lease {
    b.try_acquire(k, ttl).await.expect("try").expect(what)
}

/// Whether a single try for `kind` on `k` is refused (its errors fail).
pub async fn refused(b: &ZkBackend, k: &LockKey, kind: LeaseKind) -> bool {
    b.try_acquire_kind(k, kind, TTL).await.unwrap().is_none()
}

/// `b` waits (up to 10 s) for `kind` on `k` in a task of its own, which
/// returns when it was granted and the lease.
pub fn spawn_wait(
    b: &ZkBackend,
    k: &LockKey,
    kind: LeaseKind,
) -> JoinHandle<(Instant, Result<Lease, LockError>)> {
    let (b, k) = (b.clone(), k.clone());
    tokio::spawn(async move {
        let lease = b.acquire_kind(&k, kind, TTL, soon(10_000)).await;
        (Instant::now(), lease)
    })
}

/// `b` waits (up to 10 s) for the mutex `k` in a task of its own, which
/// returns when it was granted and the lease.
pub fn spawn_acquire(
    b: &ZkBackend,
    k: &LockKey,
) -> JoinHandle<(Instant, Result<Lease, LockError>)> {
    let (b, k) = (b.clone(), k.clone());
    tokio::spawn(async move {
        let lease = b.acquire(&k, TTL, soon(10_000)).await;
        (Instant::now(), lease)
    })
}

/// The shared suite on a started deployment ([`deployed`]), if any: its
/// table printed, every case passed.
pub async fn run_suite_on(target: Option<DeployedTarget>) {
    let Some(target) = target else {
        return;
    };
    let harness = conformance::Harness::new(Arc::new(target));
    let report = conformance::run_suite(&harness).await;
    println!("{}", report.table());
    report.assert_passed();
}

/// Waits (up to 5 s) until `dir` has at least `n` children, or fails
/// with `what`.
pub async fn until_children(raw: &zookeeper_client::Client, dir: &str, n: usize, what: &str) {
    timeout(Duration::from_secs(5), async {
        while raw.list_children(dir).await.unwrap().len() < n {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

/// What the suite's clients add to a deployment's URL (which already
/// carries its short `session_timeout`).
pub const CLIENT_OPTIONS: &str = "timeout=3s&connect_timeout=15s";

/// `url` with `options` appended to its query.
pub fn with_options(url: &str, options: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{options}")
}

/// Opens this driver's backend from a deployment's URL plus
/// [`CLIENT_OPTIONS`].
pub fn opener() -> Opener {
    opener_with("")
}

/// [`opener`] with `extra` options after [`CLIENT_OPTIONS`] (e.g.
/// `nodes=kazoo`).
pub fn opener_with(extra: &'static str) -> Opener {
    Arc::new(move |url: String| {
        Box::pin(async move {
            let mut url = with_options(&url, CLIENT_OPTIONS);
            if !extra.is_empty() {
                url = with_options(&url, extra);
            }
            Ok(Arc::new(lock_zk::connect(&url).await?) as Arc<dyn LockBackend>)
        })
    })
}

/// A started deployment (`zookeeper`, `zookeeper-ensemble`) as a suite
/// target, or `None` (skip) when ZooKeeper is missing.
pub async fn deployed(kind: &str) -> Option<DeployedTarget> {
    deployed_with(kind, "").await
}

/// [`deployed`], its clients opened with `extra` options
/// ([`opener_with`]).
pub async fn deployed_with(kind: &str, extra: &'static str) -> Option<DeployedTarget> {
    let deployment = deploy::start(kind).await.or_skip()?;
    Some(DeployedTarget::new(deployment, opener_with(extra)))
}

/// The session timeout the fault tests ask for (8 ticks of 500 ms): they
/// time pauses against it.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// A standalone server (the `zookeeper` deployment) for the fault tests,
/// which need this driver's own backend type, a raw client for outside
/// interference, and the server paused on demand.
pub struct Standalone {
    base_url: String,
    deployment: Mutex<Box<dyn Deployment>>,
}

impl Standalone {
    /// Starts the server, or `None` (skip) when ZooKeeper is missing.
    pub async fn start() -> Option<Self> {
        let deployment = deploy::start("zookeeper").await.or_skip()?;
        let url = deployment.url();
        let base_url = url.split_once('?').map_or(url.as_str(), |(b, _)| b);
        Some(Self {
            base_url: base_url.to_owned(),
            deployment: Mutex::new(deployment),
        })
    }

    /// The base URL (no options).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The URL the clients use: [`SESSION_TIMEOUT`] rather than the
    /// deployment's shorter one.
    pub fn client_url(&self) -> String {
        with_options(
            &format!(
                "{}?session_timeout={}ms",
                self.base_url,
                SESSION_TIMEOUT.as_millis()
            ),
            CLIENT_OPTIONS,
        )
    }

    /// A new backend with its own session.
    pub async fn backend(&self) -> Result<ZkBackend, LockError> {
        ZkBackend::connect(ZkConfig::from_url(&self.client_url())?).await
    }

    /// A new backend with its own session and `options` added to the
    /// client URL (`layout=path`, `root=...`); panics with `what` when it
    /// cannot connect.
    pub async fn backend_with(&self, options: &str, what: &str) -> ZkBackend {
        let url = with_options(&self.client_url(), options);
        ZkBackend::connect(ZkConfig::from_url(&url).expect("config"))
            .await
            .expect(what)
    }

    /// `n` new backends, each with its own session.
    pub async fn backends(&self, n: usize) -> Vec<ZkBackend> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.backend().await.expect("backend"));
        }
        out
    }

    /// A raw client of the same server, for outside interference.
    pub async fn raw(&self) -> zookeeper_client::Client {
        let hosts = self.base_url.trim_start_matches("zk://").to_owned();
        zookeeper_client::Client::connector()
            .with_session_timeout(SESSION_TIMEOUT)
            .connect(&hosts)
            .await
            .expect("raw ZooKeeper client")
    }

    /// SIGSTOP the server.
    pub async fn pause(&self) -> Result<(), HarnessError> {
        self.deployment.lock().await.pause()
    }

    /// SIGCONT the server.
    pub async fn resume(&self) -> Result<(), HarnessError> {
        self.deployment.lock().await.resume()
    }
}
