//! The whole suite against the in-memory backend, and proof that the suite
//! can fail: a deliberately broken backend that grants twice is caught.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::cases;
use conformance::doubles::{Flaw, FlawedTarget, rogue_lease};
use conformance::{Harness, MemoryTarget, SuiteConfig, run_suite};
use lock_core::{FencingToken, Lease, LockError, LockKey};

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
#[derive(Debug, Default)]
struct DoubleGranting {
    calls: AtomicU64,
    rogue_token: AtomicU64,
}

impl Flaw for DoubleGranting {
    fn name(&self) -> &'static str {
        "double-granting"
    }
    fn contended(&self, key: &LockKey, ttl: Duration) -> Option<Lease> {
        if !self.calls.fetch_add(1, Ordering::SeqCst).is_multiple_of(3) {
            return None;
        }
        let token = self.rogue_token.fetch_add(1, Ordering::SeqCst) + 1;
        rogue_lease(key, ttl, FencingToken::new(token)).ok()
    }
    fn release(&self, _: &Lease, result: Result<bool, LockError>) -> Result<bool, LockError> {
        // Rogue leases are unknown to the inner service: report them held.
        result.map(|_| true)
    }
}

fn broken_harness() -> Harness {
    Harness::with_config(
        Arc::new(FlawedTarget::new(DoubleGranting::default())),
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
        Err(why) => assert!(
            why.contains("overlapping") || why.contains("inside") || why.contains("lost updates"),
            "unexpected failure text: {why}"
        ),
        other => panic!("a double-granting backend passed mutual exclusion: {other:?}"),
    }
}

/// The guard case asks for the key from another client while a guard
/// renews it: a second grant then is a double holder, told apart from a
/// lock the guard lost (its deadline passed before the other client asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_case_catches_a_backend_that_grants_twice() {
    match cases::guard_keeps_lock_past_ttl(&broken_harness()).await {
        Err(why) => assert!(
            why.starts_with("another client got the key while the guard held it"),
            "{why}"
        ),
        other => panic!("a double-granting backend passed the guard case: {other:?}"),
    }
}

/// Hands out a token from an old grant every tenth time, contended or not.
#[derive(Debug, Default)]
struct StaleTokens {
    grants: AtomicU64,
}

impl Flaw for StaleTokens {
    fn name(&self) -> &'static str {
        "stale-tokens"
    }
    fn grant(&self, lease: Lease) -> Lease {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_tokens_that_go_backwards() {
    let h = Harness::with_config(
        Arc::new(FlawedTarget::new(StaleTokens::default())),
        SuiteConfig {
            fencing_grants: 200,
            ..SuiteConfig::default()
        },
    );
    match cases::fencing_tokens_increase(&h).await {
        Err(why) => assert!(
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

/// The composed shapes are judged by the same history checker: a backend
/// that grants twice makes the multi-lock loop and the election loop fail
/// (two holders of a key, two leaders at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_grants_are_caught_in_multi_locks_and_elections() {
    let h = broken_harness();
    match cases::multi_locks_never_deadlock(&h).await {
        Err(why) => assert!(why.contains("two holders"), "{why}"),
        other => panic!("a double-granting backend passed the multi-lock loop: {other:?}"),
    }
    match cases::one_leader_at_a_time(&h).await {
        Err(why) => assert!(why.contains("two leaders"), "{why}"),
        other => panic!("a double-granting backend passed the election loop: {other:?}"),
    }
}

/// A multi-lock keeps the keys it took first only through `renew_many`
/// (the partial set is renewed together while a later key is waited for):
/// with a `renew_many` that renews nothing and says it did, the first key
/// runs out on the server during the wait and the other client gets it.
#[derive(Debug)]
struct RenewManyDoesNothing;

impl Flaw for RenewManyDoesNothing {
    fn name(&self) -> &'static str {
        "renew-many-does-nothing"
    }
    fn renew_many_is_a_no_op(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_that_does_not_renew_its_first_keys_is_caught() {
    let h = Harness::new(Arc::new(FlawedTarget::new(RenewManyDoesNothing)));
    match cases::multi_lock_keeps_its_first_keys_while_waiting(&h).await {
        Err(why) => assert!(
            why.starts_with("another client took")
                && why.contains("while the multi-lock that held it waited"),
            "{why}"
        ),
        other => panic!("a multi-lock whose renew_many does nothing passed: {other:?}"),
    }
}
