//! Proof that the operating checks can fail: broken backends on the
//! in-memory service, each caught by the case written for its mistake (the
//! same cases pass on the correct memory backend, see `memory_suite`).
//!
//! - `NoDetails` claims holder details and reports none.
//! - `ForeignDetails` reports another process as the holder.
//! - `ListsTwice` returns a lock twice in one page.
//! - `ListsOutsidePrefix` returns a lock beside the prefix.
//! - `TokenResetByForce` restarts a key's tokens after a forced release.
//! - `BrokenHolderRenews` lets the broken holder renew.
//! - `WatchMisses` has a `watch_holder` that never sees a change.
//! - `SharedNoDetails` reports readers, writers and permit holders without
//!   details (`NoDetails` also catches a leader without them).
//! - `ListsSharedTwice` returns a read-write lock twice in one page.
//! - `ListsOtherShape` lists the prefix's mutex among its read-write locks.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use conformance::cases::{self, CaseResult};
use conformance::doubles::{Flaw, FlawedTarget};
use conformance::{Harness, SuiteConfig};
use lock_core::{
    Capabilities, FencingToken, HolderInfo, Lease, LockError, LockInfo, LockKey, LockPage,
    SharedPage,
};
use tokio::time::Instant;

#[derive(Debug)]
enum Kind {
    NoDetails,
    ForeignDetails,
    ListsTwice,
    ListsOutsidePrefix,
    TokenResetByForce,
    BrokenHolderRenews,
    WatchMisses,
    SharedNoDetails,
    ListsSharedTwice,
    ListsOtherShape,
}

#[derive(Debug)]
struct Broken {
    kind: Kind,
    forced: Mutex<HashSet<LockKey>>,
}

impl Broken {
    fn was_forced(&self, key: &LockKey) -> bool {
        self.forced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(key)
    }
}

impl Flaw for Broken {
    fn name(&self) -> &'static str {
        "broken-admin"
    }

    fn capabilities(&self, inner: Capabilities) -> Capabilities {
        inner
    }

    fn grant(&self, lease: Lease) -> Lease {
        if matches!(self.kind, Kind::TokenResetByForce) && self.was_forced(lease.key()) {
            // The counter started over.
            return Lease::from_parts(
                lease.key().clone(),
                lease.owner(),
                FencingToken::new(1),
                lease.ttl(),
                lease.validity_deadline(),
                lease.backend_data().to_owned(),
            );
        }
        lease
    }

    fn renew(
        &self,
        lease: &Lease,
        result: Result<Instant, LockError>,
    ) -> Result<Instant, LockError> {
        if matches!(self.kind, Kind::BrokenHolderRenews) && self.was_forced(lease.key()) {
            return Ok(Instant::now() + lease.ttl());
        }
        result
    }

    fn inspect(&self, info: Option<LockInfo>) -> Option<LockInfo> {
        info.map(|mut info| {
            match self.kind {
                Kind::NoDetails => info.details = None,
                Kind::ForeignDetails => {
                    if let Some(details) = &mut info.details {
                        details.pid = details.pid.wrapping_add(1);
                    }
                }
                _ => {}
            }
            info
        })
    }

    fn list(&self, mut page: LockPage) -> LockPage {
        match self.kind {
            Kind::ListsTwice => {
                if let Some(first) = page.locks.first().cloned() {
                    match page.locks.get_mut(1) {
                        Some(second) => *second = first,
                        None => page.locks.push(first),
                    }
                }
            }
            Kind::ListsOutsidePrefix => {
                // `<ns>/list/<i>` becomes `<ns>/listx`, held beside the
                // prefix.
                if let Some(first) = page.locks.first_mut() {
                    let text = first.key.as_str();
                    let dir = text.rsplit_once('/').map_or(text, |(dir, _)| dir);
                    first.key = LockKey::new(format!("{dir}x")).expect("key");
                }
            }
            _ => {}
        }
        page
    }

    fn holders(&self, mut holders: Vec<HolderInfo>) -> Vec<HolderInfo> {
        if matches!(self.kind, Kind::SharedNoDetails) {
            for holder in &mut holders {
                holder.details = None;
            }
        }
        holders
    }

    fn list_shared(&self, mut page: SharedPage) -> SharedPage {
        match self.kind {
            Kind::ListsSharedTwice => {
                if let Some(first) = page.locks.first().cloned() {
                    match page.locks.get_mut(1) {
                        Some(second) => *second = first,
                        None => page.locks.push(first),
                    }
                }
            }
            Kind::ListsOtherShape => {
                // `<ns>/lists/<name>` becomes `<ns>/lists/m`, the mutex
                // held under the prefix.
                if let Some(first) = page.locks.first_mut() {
                    let text = first.key.as_str();
                    let dir = text.rsplit_once('/').map_or(text, |(dir, _)| dir);
                    first.key = LockKey::new(format!("{dir}/m")).expect("key");
                }
            }
            _ => {}
        }
        page
    }

    fn watch_misses(&self) -> bool {
        matches!(self.kind, Kind::WatchMisses)
    }

    fn forced(&self, key: &LockKey) {
        self.forced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
    }
}

fn harness(kind: Kind) -> Harness {
    Harness::with_config(
        Arc::new(FlawedTarget::new(Broken {
            kind,
            forced: Mutex::default(),
        })),
        SuiteConfig::default(),
    )
}

fn assert_failed(outcome: CaseResult, what: &str, says: &str) {
    println!("{what}: {outcome:?}");
    match outcome {
        Err(why) => assert!(why.contains(says), "{what}: {why}"),
        Ok(other) => panic!("{what} was not caught: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_foreign_holder_details_are_caught() {
    assert_failed(
        cases::holder_details_are_reported(&harness(Kind::NoDetails)).await,
        "no details",
        "no holder details",
    );
    assert_failed(
        cases::holder_details_are_reported(&harness(Kind::ForeignDetails)).await,
        "another pid",
        "another process",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_list_pages_are_caught() {
    assert_failed(
        cases::list_finds_held_locks(&harness(Kind::ListsTwice)).await,
        "a lock twice",
        "twice",
    );
    assert_failed(
        cases::list_finds_held_locks(&harness(Kind::ListsOutsidePrefix)).await,
        "beside the prefix",
        "returned",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_that_does_not_fence_is_caught() {
    assert_failed(
        cases::force_release_fences_the_old_holder(&harness(Kind::TokenResetByForce)).await,
        "token reset",
        "not above",
    );
    assert_failed(
        cases::force_release_fences_the_old_holder(&harness(Kind::BrokenHolderRenews)).await,
        "broken holder renews",
        "could still renew",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_misses_changes_is_caught() {
    assert_failed(
        cases::watch_follows_the_holder(&harness(Kind::WatchMisses)).await,
        "watch misses changes",
        "did not report a grant",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_and_leaders_without_details_are_caught() {
    assert_failed(
        cases::shared_holder_details_are_reported(&harness(Kind::SharedNoDetails)).await,
        "readers without details",
        "no holder details",
    );
    assert_failed(
        cases::shared_holder_details_are_reported(&harness(Kind::NoDetails)).await,
        "a leader without details",
        "the leader: no holder details",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shared_list_pages_are_caught() {
    assert_failed(
        cases::list_finds_shared_locks(&harness(Kind::ListsSharedTwice)).await,
        "a read-write lock twice",
        "twice",
    );
    assert_failed(
        cases::list_finds_shared_locks(&harness(Kind::ListsOtherShape)).await,
        "the mutex among read-write locks",
        "which is not held",
    );
}
