//! The shared conformance suite against every Redis topology, on real
//! servers started here: the `redis` deployment of `conformance::deploy`,
//! and our own targets for Cluster and Sentinel (no deployment has them).
//! Redlock's whole suite runs with one of its five nodes killed
//! (`tests/behaviour.rs`), which also covers five live nodes' paths. The
//! fair cases open the same URLs with `fair=true` (FIFO mutexes).

mod common;

use std::sync::Arc;

use common::{RedisTarget, deployed, deployed_with};
use conformance::{Harness, OrSkip, Target, all_cases, run_cases, run_suite};

/// Suites run one at a time: they measure timing on a shared machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(target: impl Target + 'static) {
    let _serial = SERIAL.lock().await;
    let harness = Harness::new(Arc::new(target));
    run_suite(&harness).await.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_single_node() {
    let Some(target) = deployed("redis").await else {
        return;
    };
    run(target).await;
}

/// Fair mode (`fair=true`) on one server: the mutex cases that fair mode
/// changes, the FIFO case among them (the backend reports `fifo`). The
/// rest of the suite takes the same paths as without `fair`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_mutex_cases_on_a_single_node() {
    let Some(target) = deployed_with("redis", "fair=true").await else {
        return;
    };
    run_fair_mutex_cases(target).await;
}

/// Fair mode in Cluster: the mutex cases that fair mode changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_mutex_cases_in_cluster() {
    let Some(target) = RedisTarget::cluster().await.or_skip() else {
        return;
    };
    run_fair_mutex_cases(target.with_option("fair=true")).await;
}

/// The mutex cases that fair mode changes (waiting, its queue) or whose
/// scripts it replaces (grant, renew, release, inspect, a forced
/// release), on `target` (opened in fair mode).
async fn run_fair_mutex_cases(target: impl Target + 'static) {
    let wanted = [
        "inspect_reports_holder",
        "stale_release_is_refused",
        "renew_extends",
        "expiry_frees_key",
        "force_release_fences_the_old_holder",
        "mutual_exclusion",
        "waiters_are_served_in_order",
        "acquire_times_out_at_deadline",
        "dropped_acquire_leaves_nothing",
        "multi_lock_is_all_or_nothing",
        "one_leader_at_a_time",
    ];
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| wanted.contains(&c.name))
        .collect();
    assert_eq!(cases.len(), wanted.len(), "a case was renamed");
    let _serial = SERIAL.lock().await;
    let harness = Harness::new(Arc::new(target));
    run_cases(&harness, &cases).await.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_cluster() {
    let Some(target) = RedisTarget::cluster().await.or_skip() else {
        return;
    };
    run(target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_sentinel() {
    let Some(target) = RedisTarget::sentinel().await.or_skip() else {
        return;
    };
    run(target).await;
}

/// Fair mode through Sentinel (the scripts run on the master it
/// resolves): the mutex cases that fair mode changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_mutex_cases_through_sentinel() {
    let Some(target) = RedisTarget::sentinel().await.or_skip() else {
        return;
    };
    run_fair_mutex_cases(target.with_option("fair=true")).await;
}

/// The descriptor's capabilities (read from the URL alone) are what a
/// backend connected with that URL reports, for one server and for Redlock
/// (whose fencing differs: a descriptor that ignored the topology fails
/// one of the two comparisons).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_capabilities_match_a_connected_backend() {
    let of = lock_redis::DRIVER.capabilities.expect("capabilities");
    let mut seen = Vec::new();
    for kind in ["redis", "redlock"] {
        let Some(target) = deployed(kind).await else {
            return;
        };
        let url = target.url();
        let endpoint = lock_core::endpoint::Endpoint::parse(&url).expect("a URL");
        let promised = of(&endpoint).expect("caps");
        let backend = (lock_redis::DRIVER.connect)(endpoint, lock_core::Requirements::none())
            .await
            .expect("connect");
        assert_eq!(promised, backend.capabilities(), "{kind}: {url}");
        seen.push(promised);
    }
    assert_ne!(seen[0], seen[1], "Redlock reports other fencing");
}
