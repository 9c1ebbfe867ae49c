//! The suite gates on the facets a backend *has*, not on `Unsupported`
//! answers: a present facet that answers `Unsupported` fails its case, a
//! missing facet skips its case naming it, and a backend that claims
//! read-write locks without the `Downgrade` facet fails. Each double here
//! is the in-memory service behind a [`LockWrapper`] that changes only its
//! facets.
//!
//! - `GcRefused` claims the `Admin` facet, but its `gc` answers
//!   `Unsupported`: the gc case fails (not a skip).
//! - `NoFacets` hides every facet: the admin, downgrade and lock-set cases
//!   are skipped naming their facet, the multi-lock, election and watch
//!   cases still run (on their fallbacks); read-write locks are still
//!   claimed, so the downgrade case fails.
//! - `MutexOnly` hides every facet and claims no read-write locks or
//!   semaphores: nothing fails, and every skip names a facet, a capability
//!   or what the target cannot do.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{Harness, SuiteReport, Target, all_cases, run_cases};
use lock_core::election::ElectionPage;
use lock_core::{
    Admin, Capabilities, ErrorKind, Facets, GcReport, ListQuery, Listing, LockBackend,
    LockBackendExt, LockError, LockInfo, LockKey, LockPage, LockShape, LockWrapper, MemoryBackend,
    Operation, SharedPage,
};

/// What a [`Wrapped`] double changes.
#[derive(Clone, Copy, Debug)]
enum Double {
    GcRefused,
    NoFacets,
    MutexOnly,
}

/// The in-memory service with `Double`'s facets.
#[derive(Debug)]
struct Wrapped {
    inner: MemoryBackend,
    double: Double,
}

#[async_trait]
impl LockWrapper for Wrapped {
    fn inner(&self) -> &dyn LockBackend {
        &self.inner
    }

    fn name(&self) -> &'static str {
        match self.double {
            Double::GcRefused => "gc-refused",
            Double::NoFacets => "no-facets",
            Double::MutexOnly => "mutex-only",
        }
    }

    fn capabilities(&self) -> Capabilities {
        let inner = self.inner.capabilities();
        match self.double {
            Double::MutexOnly => Capabilities {
                shared_locks: false,
                semaphores: false,
                ..inner
            },
            _ => inner,
        }
    }

    fn facets(&self) -> Facets<'_> {
        match self.double {
            Double::GcRefused => Facets {
                listing: Some(self),
                admin: Some(self),
                ..self.inner.facets()
            },
            Double::NoFacets | Double::MutexOnly => Facets::default(),
        }
    }
}

/// The memory service's administration, except `gc`.
#[async_trait]
impl Admin for Wrapped {
    async fn force_release(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        LockBackendExt::force_release(&self.inner, key).await
    }

    /// Broken on purpose: the facet is claimed, the call refused.
    async fn gc(&self, _older_than: Duration) -> Result<GcReport, LockError> {
        Err(LockError::new(
            ErrorKind::Unsupported,
            Operation::Inspect,
            "garbage collection is not implemented",
        ))
    }
}

#[async_trait]
impl Listing for Wrapped {
    async fn list(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        LockBackendExt::list(&self.inner, query).await
    }

    async fn list_shared(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        LockBackendExt::list_shared(&self.inner, shape, query).await
    }

    async fn list_elections(&self, query: &ListQuery) -> Result<ElectionPage, LockError> {
        LockBackendExt::list_elections(&self.inner, query).await
    }
}

/// Clients of one in-memory service, each behind the double.
struct WrappedTarget {
    service: MemoryBackend,
    double: Double,
}

#[async_trait]
impl Target for WrappedTarget {
    fn name(&self) -> String {
        format!("{:?}", self.double)
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(Wrapped {
            inner: self.service.clone(),
            double: self.double,
        }))
    }
}

/// Runs the named cases of the suite against `double`.
async fn run(double: Double, names: &[&str]) -> SuiteReport {
    let harness = Harness::new(Arc::new(WrappedTarget {
        service: MemoryBackend::new(),
        double,
    }));
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| names.contains(&c.name))
        .collect();
    assert_eq!(cases.len(), names.len(), "a case name is not in the suite");
    let report = run_cases(&harness, &cases).await;
    println!("{}", report.table());
    report
}

fn verdict<'a>(report: &'a SuiteReport, case: &str) -> (&'a str, &'a str) {
    let c = report
        .cases
        .iter()
        .find(|c| c.name == case)
        .unwrap_or_else(|| panic!("{case} did not run"));
    (c.verdict, c.detail.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_admin_facet_whose_gc_is_unsupported_fails() {
    let report = run(
        Double::GcRefused,
        &[
            "list_finds_held_locks",
            "force_release_fences_the_old_holder",
            "gc_keeps_tokens_rising",
        ],
    )
    .await;
    assert_eq!(
        report.facets,
        ["listing", "admin", "lock_sets", "downgrade"]
    );
    let (gc, why) = verdict(&report, "gc_keeps_tokens_rising");
    assert_eq!(
        gc, "failed",
        "gc answering Unsupported was not failed: {why}"
    );
    assert!(
        why.contains("Admin facet") && why.contains("Unsupported"),
        "{why}"
    );
    // The rest of the facet serves: those cases pass.
    assert_eq!(verdict(&report, "list_finds_held_locks").0, "passed");
    assert_eq!(
        verdict(&report, "force_release_fences_the_old_holder").0,
        "passed"
    );
    assert!(!report.passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_facets_skip_their_cases_by_name() {
    let report = run(
        Double::NoFacets,
        &[
            "list_finds_held_locks",
            "force_release_fences_the_old_holder",
            "gc_keeps_tokens_rising",
            "list_finds_shared_locks",
            "lock_sets_are_atomic",
            "multi_lock_is_all_or_nothing",
            "multi_locks_never_deadlock",
            "one_leader_at_a_time",
            "watch_follows_the_holder",
            "downgrade_leaves_no_gap",
        ],
    )
    .await;
    assert!(report.facets.is_empty(), "{:?}", report.facets);
    for case in [
        "list_finds_held_locks",
        "force_release_fences_the_old_holder",
        "gc_keeps_tokens_rising",
        "list_finds_shared_locks",
    ] {
        let (verdict, why) = verdict(&report, case);
        assert_eq!(verdict, "skipped", "{case}: {why}");
        let facet = if case.starts_with("list") {
            "no Listing facet"
        } else {
            "no Admin facet"
        };
        assert!(why.contains(facet), "{case}: {why}");
    }
    let (sets, why) = verdict(&report, "lock_sets_are_atomic");
    assert_eq!(sets, "skipped", "{why}");
    assert!(why.contains("no LockSets facet"), "{why}");
    // Fallbacks: multi-locks key by key, elections through the mutex,
    // watches by polling.
    for case in [
        "multi_lock_is_all_or_nothing",
        "multi_locks_never_deadlock",
        "one_leader_at_a_time",
        "watch_follows_the_holder",
    ] {
        let (verdict, why) = verdict(&report, case);
        assert_eq!(verdict, "passed", "{case}: {why}");
    }
    // Read-write locks claimed, no way to downgrade them: a failure.
    let (downgrade, why) = verdict(&report, "downgrade_leaves_no_gap");
    assert_eq!(downgrade, "failed", "{why}");
    assert!(why.contains("no Downgrade facet"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_only_backend_without_facets_passes_with_named_skips() {
    let names: Vec<&str> = all_cases().iter().map(|c| c.name).collect();
    let report = run(Double::MutexOnly, &names).await;
    assert!(report.passed(), "failures: {:?}", report.failures());
    // Skipped for a missing facet, a capability not claimed, or a fault
    // this target cannot inject; never for an `Unsupported` answer.
    for case in report.cases.iter().filter(|c| c.verdict == "skipped") {
        assert!(
            ["facet", "claim", "target"]
                .iter()
                .any(|why| case.detail.contains(why)),
            "{}: skipped without naming a facet, a capability or the target: {}",
            case.name,
            case.detail
        );
        assert!(!case.detail.contains("Unsupported"), "{}", case.detail);
    }
    assert_eq!(verdict(&report, "downgrade_leaves_no_gap").0, "skipped");
}
