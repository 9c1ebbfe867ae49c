//! Proof that the safety checks can fail: deliberately broken backends,
//! each built on the in-memory service, that the suite must catch.
//!
//! - `ReplyTimeDeadline` dates each lease's deadline from the moment the
//!   reply arrived instead of when the request was sent: with latency on
//!   the link it promises more than the server keeps.
//! - `RenewsAnything` answers every renewal with a fresh deadline, even for
//!   a lease it no longer owns.
//! - `ExpiredGrants` hands out every fifth grant with its deadline already
//!   passed.
//!
//! The same scenarios and cases pass on the correct in-memory backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::cases::{self, Outcome};
use conformance::proxy::FaultProxy;
use conformance::scenarios::{self, ScenarioEnv, Verdict};
use conformance::{Harness, HarnessError, MemoryTarget, SuiteConfig, Target};
use lock_core::{
    Capabilities, Lease, LockBackend, LockError, LockInfo, LockKey, MemoryBackend, async_trait,
    validity_deadline,
};
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    ReplyTimeDeadline,
    RenewsAnything,
    ExpiredGrants,
}

#[derive(Debug)]
struct Broken {
    inner: Arc<dyn LockBackend>,
    flaw: Flaw,
    grants: AtomicU64,
}

impl Broken {
    fn new(inner: Arc<dyn LockBackend>, flaw: Flaw) -> Self {
        Self {
            inner,
            flaw,
            grants: AtomicU64::new(0),
        }
    }

    fn spoil(&self, lease: Lease) -> Lease {
        let deadline = match self.flaw {
            Flaw::ReplyTimeDeadline => validity_deadline(Instant::now(), lease.ttl()),
            Flaw::ExpiredGrants
                if (self.grants.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(5) =>
            {
                Instant::now()
                    .checked_sub(Duration::from_millis(1))
                    .unwrap_or_else(Instant::now)
            }
            _ => return lease,
        };
        Lease::from_parts(
            lease.key().clone(),
            lease.owner(),
            lease.token(),
            lease.ttl(),
            deadline,
            lease.backend_data().to_owned(),
        )
    }
}

#[async_trait]
impl LockBackend for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, key: &LockKey, ttl: Duration) -> Result<Option<Lease>, LockError> {
        Ok(self
            .inner
            .try_acquire(key, ttl)
            .await?
            .map(|l| self.spoil(l)))
    }
    async fn acquire(
        &self,
        key: &LockKey,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        Ok(self.spoil(self.inner.acquire(key, ttl, deadline).await?))
    }
    async fn renew(&self, lease: &Lease) -> Result<Instant, LockError> {
        let result = self.inner.renew(lease).await;
        match self.flaw {
            Flaw::ReplyTimeDeadline => {
                result.map(|_| validity_deadline(Instant::now(), lease.ttl()))
            }
            Flaw::RenewsAnything => {
                Ok(result.unwrap_or_else(|_| validity_deadline(Instant::now(), lease.ttl())))
            }
            Flaw::ExpiredGrants => result,
        }
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        self.inner.inspect(key).await
    }
}

/// The broken backend on an in-memory service; its proxied client is the
/// broken backend over an in-process faulty link (the flaw sits in the
/// client, where a driver's bug would).
struct BrokenTarget {
    service: MemoryBackend,
    flaw: Flaw,
}

#[async_trait]
impl Target for BrokenTarget {
    fn name(&self) -> String {
        format!("broken-{:?}", self.flaw)
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(Broken::new(
            Arc::new(self.service.clone()),
            self.flaw,
        )))
    }
    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let (link, proxy) =
            FaultProxy::in_process(Arc::new(self.service.clone()), Duration::from_secs(1));
        Ok(Some((Arc::new(Broken::new(link, self.flaw)), proxy)))
    }
}

fn target(flaw: Flaw) -> Arc<dyn Target> {
    Arc::new(BrokenTarget {
        service: MemoryBackend::new(),
        flaw,
    })
}

fn harness(target: Arc<dyn Target>) -> Harness {
    Harness::with_config(
        target,
        SuiteConfig {
            fencing_grants: 200,
            ..SuiteConfig::default()
        },
    )
}

fn env(target: Arc<dyn Target>) -> ScenarioEnv {
    ScenarioEnv {
        target,
        holder: None,
        quick: true,
        ttl: Duration::from_secs(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_scenarios_pass_on_memory_through_the_in_process_link() {
    let env = env(Arc::new(MemoryTarget::new()));
    for name in [
        "latency_injected",
        "client_partitioned",
        "release_reply_lost",
    ] {
        let report = scenarios::run_scenario(name, &env).await;
        assert_eq!(report.verdict, Verdict::Safe, "{name}: {}", report.detail);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_catches_a_deadline_dated_from_the_reply() {
    let report =
        scenarios::run_scenario("latency_injected", &env(target(Flaw::ReplyTimeDeadline))).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert!(report.detail.contains("overlapping"), "{}", report.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_is_held_to_the_servers_free_time() {
    let good = cases::lost_signal_when_unreachable(&harness(Arc::new(MemoryTarget::new()))).await;
    assert!(matches!(good, Outcome::Passed(_)), "{good:?}");
    match cases::lost_signal_when_unreachable(&harness(target(Flaw::ReplyTimeDeadline))).await {
        Outcome::Failed(why) => assert!(why.contains("BEFORE the holder was told"), "{why}"),
        other => panic!("a late lost signal passed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_a_lease_it_does_not_own_is_caught() {
    let h = harness(target(Flaw::RenewsAnything));
    for (name, outcome) in [
        (
            "only_owner_can_release_or_renew",
            cases::only_owner_can_release_or_renew(&h).await,
        ),
        (
            "stale_release_is_refused",
            cases::stale_release_is_refused(&h).await,
        ),
        ("expiry_frees_key", cases::expiry_frees_key(&h).await),
    ] {
        match outcome {
            Outcome::Failed(why) => assert!(why.contains("renew"), "{name}: {why}"),
            other => panic!("{name} passed on a backend that renews anything: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_past_their_deadline_are_caught() {
    let h = harness(target(Flaw::ExpiredGrants));
    match cases::mutual_exclusion(&h).await {
        Outcome::Failed(why) => assert!(why.contains("past their deadline"), "{why}"),
        other => panic!("expired grants passed mutual exclusion: {other:?}"),
    }
    let report =
        scenarios::run_scenario("latency_injected", &env(target(Flaw::ExpiredGrants))).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
}
