//! The randomized fault soak, briefly: on the in-memory backend and on a
//! real etcd it finds no violation and injects every fault kind it
//! schedules; the same seed gives the same schedule; on deliberately broken
//! backends (double grants, with and without fencing) it reports the
//! violations; on a backend without fencing, frozen clients' late writes
//! are reported as an expected negative control, not a failure.
//!
//! The tests run in parallel; the file takes about 25 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conformance::deploy::{DeployedTarget, Deployment, Opener};
use conformance::soak::{FaultKind, SoakConfig, SoakReport, plan, run_soak};
use conformance::{MemoryTarget, OrSkip, Target};
use lock_core::{
    Capabilities, FencingScope, FencingToken, Lease, LockBackend, LockError, LockInfo, LockKey,
    MemoryBackend, OwnerId,
};
use tokio::time::Instant;

fn assert_clean(report: &SoakReport) {
    let table = report.table();
    assert!(!report.fails_run(), "{table}");
    assert_eq!(report.violations.len(), 0, "{table}");
    assert!(report.check.is_safe_with_fencing(), "{table}");
    assert_eq!(report.lost_increments, 0, "{table}");
    assert!(report.grants > 10, "{table}");
    for kind in &report.kinds {
        let injected = report.faults.get(kind.as_str()).map_or(0, |s| s.injected);
        assert!(
            injected > 0,
            "{kind} was scheduled but never injected\n{table}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_schedule() {
    let kinds = FaultKind::ALL;
    let ttl = Duration::from_secs(1);
    let a = plan(12345, kinds, Duration::from_secs(600), ttl);
    let b = plan(12345, kinds, Duration::from_secs(600), ttl);
    let c = plan(12346, kinds, Duration::from_secs(600), ttl);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Each kind of the lane comes once first, so short runs see them all.
    let lane: Vec<FaultKind> = kinds
        .iter()
        .copied()
        .filter(|k| *k != FaultKind::ClientFreeze)
        .collect();
    let mut first: Vec<FaultKind> = a.faults[..lane.len()].iter().map(|f| f.kind).collect();
    first.sort();
    assert_eq!(first, lane);
    assert!(!a.freezes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_soak_is_clean() {
    let target: Arc<dyn Target> = Arc::new(MemoryTarget::new());
    let config = SoakConfig::new(Duration::from_secs(15), 7);
    let report = run_soak(target, None, &config).await.expect("soak runs");
    println!("{}", report.table());
    assert!(report.kinds.contains(&FaultKind::ClientFreeze));
    assert!(report.kinds.contains(&FaultKind::ServerPause));
    assert!(report.kinds.contains(&FaultKind::ClientPartition));
    assert_clean(&report);
}

fn etcd_opener() -> Opener {
    Arc::new(|url: String| {
        Box::pin(async move {
            let backend: Arc<dyn LockBackend> = Arc::new(lock_etcd::connect(&url).await?);
            Ok(backend)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_soak_is_clean() {
    let Some(deployment) = Deployment::start("etcd").await.or_skip() else {
        return;
    };
    let target = Arc::new(DeployedTarget::new(deployment, etcd_opener()));
    let config = SoakConfig::new(Duration::from_secs(20), 11);
    let report = run_soak(target, None, &config).await.expect("soak runs");
    println!("{}", report.table());
    for kind in [
        FaultKind::ClientFreeze,
        FaultKind::ClientLatency,
        FaultKind::ClientPartition,
        FaultKind::ServerPause,
        FaultKind::ServerRestart,
    ] {
        assert!(report.kinds.contains(&kind), "{kind} applies to etcd");
    }
    assert_eq!(report.client_links, "tcp proxy");
    assert_clean(&report);
}

/// A memory backend that, every fourth acquire of a held key, grants it
/// anyway (a lease the real service knows nothing about, with a low token),
/// optionally claiming to have no fencing.
#[derive(Debug)]
struct DoubleGranting {
    inner: MemoryBackend,
    calls: AtomicU64,
    fencing: bool,
    fake_tokens: AtomicU64,
}

impl DoubleGranting {
    fn new(fencing: bool) -> Self {
        Self {
            inner: MemoryBackend::new(),
            calls: AtomicU64::new(0),
            fencing,
            fake_tokens: AtomicU64::new(0),
        }
    }

    /// A grant the service knows nothing about. Its token repeats a low
    /// value, so tokens also go backwards.
    fn fake(&self, key: &LockKey, ttl: Duration, sent_at: Instant) -> Result<Lease, LockError> {
        let token = self.fake_tokens.fetch_add(1, Ordering::Relaxed) % 2 + 1;
        Lease::granted(
            key.clone(),
            OwnerId::random(),
            FencingToken::new(token),
            ttl,
            sent_at,
            String::new(),
        )
    }
}

#[async_trait]
impl LockBackend for DoubleGranting {
    fn name(&self) -> &'static str {
        "double-granting"
    }

    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        if self.fencing {
            caps
        } else {
            Capabilities {
                fencing: FencingScope::None,
                ..caps
            }
        }
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.inner.try_acquire(key, ttl).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let sent_at = Instant::now();
        if let Some(lease) = self.inner.try_acquire(key, ttl).await? {
            return Ok(lease);
        }
        if self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(4) {
            return self.fake(key, ttl, sent_at);
        }
        self.inner.acquire(key, ttl, deadline).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.inner.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(key).await
    }
}

struct BrokenTarget(Arc<DoubleGranting>);

#[async_trait]
impl Target for BrokenTarget {
    fn name(&self) -> String {
        "double-granting".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(self.0.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_grants_twice_is_reported() {
    // No faults at all: every violation is the backend's.
    let mut config = SoakConfig::new(Duration::from_secs(6), 3);
    config.kinds = Some(Vec::new());
    let fenced = run_soak(
        Arc::new(BrokenTarget(Arc::new(DoubleGranting::new(true)))),
        None,
        &config,
    )
    .await
    .expect("soak runs");
    println!("{}", fenced.table());
    assert!(fenced.fails_run(), "{}", fenced.table());
    assert!(fenced.check.overlap_count > 0, "{}", fenced.table());
    assert_eq!(fenced.verdict, "VIOLATION");
    assert!(fenced.violations.iter().all(|v| !v.expected));
    assert!(
        fenced
            .violations
            .iter()
            .any(|v| v.what == "token_regression" || v.what == "duplicate_token"),
        "{}",
        fenced.table()
    );

    // Without fencing the resource takes every write: the double grants
    // now also lose increments of the counter.
    let unfenced = run_soak(
        Arc::new(BrokenTarget(Arc::new(DoubleGranting::new(false)))),
        None,
        &config,
    )
    .await
    .expect("soak runs");
    println!("{}", unfenced.table());
    assert!(unfenced.fails_run(), "{}", unfenced.table());
    assert!(unfenced.lost_increments > 0, "{}", unfenced.table());
    assert!(
        unfenced.violations.iter().any(|v| v.what == "lost_update"),
        "{}",
        unfenced.table()
    );
}

/// The in-memory service claiming no fencing (as Redlock does): a frozen
/// client's late write gets in, and that is a negative control.
#[derive(Debug)]
struct Unfenced(MemoryBackend);

#[async_trait]
impl LockBackend for Unfenced {
    fn name(&self) -> &'static str {
        "unfenced"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: FencingScope::None,
            ..self.0.capabilities()
        }
    }

    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        self.0.try_acquire(key, ttl).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        self.0.acquire(key, ttl, deadline).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.0.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.0.release(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.0.inspect(key).await
    }
}

struct UnfencedTarget(Arc<Unfenced>);

#[async_trait]
impl Target for UnfencedTarget {
    fn name(&self) -> String {
        "unfenced".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(self.0.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_clients_without_fencing_are_a_negative_control() {
    let mut config = SoakConfig::new(Duration::from_secs(15), 5);
    config.kinds = Some(vec![FaultKind::ClientFreeze]);
    // One key: a frozen holder's key is soon taken by someone else.
    config.keys = 1;
    let report = run_soak(
        Arc::new(UnfencedTarget(Arc::new(Unfenced(MemoryBackend::new())))),
        None,
        &config,
    )
    .await
    .expect("soak runs");
    println!("{}", report.table());
    let freeze = &report.faults["client_freeze"];
    assert!(freeze.known_unsafe.is_some());
    assert!(freeze.injected > 0, "{}", report.table());
    assert!(!report.fails_run(), "{}", report.table());
    assert!(
        report.expected_violations > 0 && report.check.stale_writes_accepted > 0,
        "a late write must get in without fencing\n{}",
        report.table()
    );
    assert!(
        report.violations.iter().any(|v| v.what == "stale_write"
            && v.expected
            && v.faults.contains(&FaultKind::ClientFreeze)),
        "the late write is tied to the freeze\n{}",
        report.table()
    );
    assert_eq!(report.check.overlap_count, 0, "{}", report.table());
}
