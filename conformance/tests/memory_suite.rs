//! The whole suite against the in-memory backend, and proof that the suite
//! can fail: a deliberately broken backend that grants twice is caught.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::cases::{self, Outcome};
use conformance::{Harness, MemoryTarget, SuiteConfig, Target, run_suite};
use lock_core::{
    Capabilities, FencingToken, Lease, LockBackend, LockError, LockInfo, LockKey, MemoryBackend,
    OwnerId, async_trait,
};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_suite_passes_on_memory() {
    let harness = Harness::new(Arc::new(MemoryTarget::new()));
    let report = run_suite(&harness).await;
    report.assert_passed();
    // Every case applies to the in-memory backend: nothing may be skipped.
    assert!(
        report.cases.iter().all(|c| c.verdict == "passed"),
        "{}",
        report.table()
    );
}

/// Grants every third contended request even though the key is held, with
/// a token from its own counter (which also lets tokens collide).
#[derive(Debug)]
struct DoubleGranting {
    inner: MemoryBackend,
    calls: AtomicU64,
    rogue_token: AtomicU64,
}

impl DoubleGranting {
    fn rogue_lease(&self, key: &LockKey, ttl: Duration) -> Result<Lease, LockError> {
        let token = self.rogue_token.fetch_add(1, Ordering::SeqCst) + 1;
        Lease::granted(
            key.clone(),
            OwnerId::random(),
            FencingToken::new(token),
            ttl,
            Instant::now(),
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
        self.inner.capabilities()
    }
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        match self.inner.try_acquire(key, ttl).await? {
            Some(lease) => Ok(Some(lease)),
            None if self.calls.fetch_add(1, Ordering::SeqCst).is_multiple_of(3) => {
                Ok(Some(self.rogue_lease(key, ttl)?))
            }
            None => Ok(None),
        }
    }
    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        if let Some(lease) = self.try_acquire(key, ttl).await? {
            return Ok(lease);
        }
        self.inner.acquire(key, ttl, deadline).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        self.inner.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        // Rogue leases are unknown to the inner service: report them held.
        Ok(self.inner.release(lease).await? || lease.owner() != OwnerId::from_u128(0))
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

fn broken_harness() -> Harness {
    let backend = Arc::new(DoubleGranting {
        inner: MemoryBackend::new(),
        calls: AtomicU64::new(0),
        rogue_token: AtomicU64::new(0),
    });
    Harness::with_config(
        Arc::new(BrokenTarget(backend)),
        SuiteConfig {
            fencing_grants: 200,
            ..SuiteConfig::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_a_backend_that_grants_twice() {
    // Mutual exclusion holds each lock across a sleep, so there is always
    // contention for the rogue grants to break.
    let h = broken_harness();
    match cases::mutual_exclusion(&h).await {
        Outcome::Failed(why) => assert!(
            why.contains("overlapping") || why.contains("inside") || why.contains("lost updates"),
            "unexpected failure text: {why}"
        ),
        other => panic!("a double-granting backend passed mutual exclusion: {other:?}"),
    }
}

/// Hands out a token from an old grant every tenth time, contended or not.
#[derive(Debug)]
struct StaleTokens {
    inner: MemoryBackend,
    grants: AtomicU64,
}

impl StaleTokens {
    fn age(&self, lease: Lease) -> Lease {
        if !(self.grants.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(10) {
            return lease;
        }
        Lease::from_parts(
            lease.key().clone(),
            lease.owner(),
            FencingToken::new(lease.token().get().saturating_sub(5)),
            lease.ttl(),
            lease.validity_deadline(),
            lease.backend_data().to_owned(),
        )
    }
}

#[async_trait]
impl LockBackend for StaleTokens {
    fn name(&self) -> &'static str {
        "stale-tokens"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        Ok(self.inner.try_acquire(key, ttl).await?.map(|l| self.age(l)))
    }
    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        Ok(self.age(self.inner.acquire(key, ttl, deadline).await?))
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

struct StaleTarget(Arc<StaleTokens>);

#[async_trait]
impl Target for StaleTarget {
    fn name(&self) -> String {
        "stale-tokens".into()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(self.0.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_tokens_that_go_backwards() {
    let h = Harness::with_config(
        Arc::new(StaleTarget(Arc::new(StaleTokens {
            inner: MemoryBackend::new(),
            grants: AtomicU64::new(0),
        }))),
        SuiteConfig {
            fencing_grants: 200,
            ..SuiteConfig::default()
        },
    );
    match cases::fencing_tokens_increase(&h).await {
        Outcome::Failed(why) => assert!(
            why.contains("token regression") || why.contains("rejected"),
            "{why}"
        ),
        other => panic!("a backend with stale tokens passed the fencing case: {other:?}"),
    }
}

#[tokio::test]
async fn suite_report_flags_failures() {
    let h = broken_harness();
    let cases: Vec<_> = conformance::all_cases()
        .into_iter()
        .filter(|c| c.name == "mutual_exclusion")
        .collect();
    let report = conformance::run_cases(&h, &cases).await;
    assert!(!report.passed());
    assert!(report.verdict().starts_with("FAIL"), "{}", report.verdict());
    let panicked = std::panic::catch_unwind(|| report.assert_passed());
    assert!(panicked.is_err(), "assert_passed accepted a failing report");
}
