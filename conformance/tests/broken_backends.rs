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
use conformance::doubles::{Flaw, FlawedTarget, with_deadline};
use conformance::scenarios::{self, ScenarioEnv, Verdict};
use conformance::{Harness, MemoryTarget, SuiteConfig, Target};
use lock_core::{Lease, LockError, validity_deadline};
use tokio::time::Instant;

#[derive(Debug)]
enum Broken {
    ReplyTimeDeadline,
    RenewsAnything,
    ExpiredGrants(AtomicU64),
}

impl Flaw for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn grant(&self, lease: Lease) -> Lease {
        match self {
            Self::ReplyTimeDeadline => {
                with_deadline(&lease, validity_deadline(Instant::now(), lease.ttl()))
            }
            Self::ExpiredGrants(grants)
                if (grants.fetch_add(1, Ordering::SeqCst) + 1).is_multiple_of(5) =>
            {
                let past = Instant::now()
                    .checked_sub(Duration::from_millis(1))
                    .unwrap_or_else(Instant::now);
                with_deadline(&lease, past)
            }
            _ => lease,
        }
    }
    fn renew(
        &self,
        lease: &Lease,
        result: Result<Instant, LockError>,
    ) -> Result<Instant, LockError> {
        match self {
            Self::ReplyTimeDeadline => {
                result.map(|_| validity_deadline(Instant::now(), lease.ttl()))
            }
            Self::RenewsAnything => {
                Ok(result.unwrap_or_else(|_| validity_deadline(Instant::now(), lease.ttl())))
            }
            Self::ExpiredGrants(_) => result,
        }
    }
}

fn target(flaw: Broken) -> Arc<dyn Target> {
    Arc::new(FlawedTarget::new(flaw))
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
        scenarios::run_scenario("latency_injected", &env(target(Broken::ReplyTimeDeadline))).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert!(report.detail.contains("overlapping"), "{}", report.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_is_held_to_the_servers_free_time() {
    let good = cases::lost_signal_when_unreachable(&harness(Arc::new(MemoryTarget::new()))).await;
    assert!(matches!(good, Ok(Outcome::Passed(_))), "{good:?}");
    match cases::lost_signal_when_unreachable(&harness(target(Broken::ReplyTimeDeadline))).await {
        Err(why) => assert!(why.contains("BEFORE the holder was told"), "{why}"),
        other => panic!("a late lost signal passed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_a_lease_it_does_not_own_is_caught() {
    let h = harness(target(Broken::RenewsAnything));
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
            Err(why) => assert!(why.contains("renew"), "{name}: {why}"),
            other => panic!("{name} passed on a backend that renews anything: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_past_their_deadline_are_caught() {
    let h = harness(target(Broken::ExpiredGrants(AtomicU64::new(0))));
    match cases::mutual_exclusion(&h).await {
        Err(why) => assert!(why.contains("past their deadline"), "{why}"),
        other => panic!("expired grants passed mutual exclusion: {other:?}"),
    }
    let report = scenarios::run_scenario(
        "latency_injected",
        &env(target(Broken::ExpiredGrants(AtomicU64::new(0)))),
    )
    .await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
}

/// A leader whose deadline is dated from the reply promises past the
/// store's expiry while its link stalls: the election case sees the next
/// leader elected inside the old one's promise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_dating_its_term_from_the_reply_is_caught() {
    let good = cases::deposed_leader_steps_down(&harness(Arc::new(MemoryTarget::new()))).await;
    assert!(matches!(good, Ok(Outcome::Passed(_))), "{good:?}");
    match cases::deposed_leader_steps_down(&harness(target(Broken::ReplyTimeDeadline))).await {
        Err(why) => assert!(why.contains("two leaders"), "{why}"),
        other => panic!("a leader with reply-dated terms passed: {other:?}"),
    }
}
