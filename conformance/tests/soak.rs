//! The randomized fault soak, briefly: on the in-memory backend and on a
//! real etcd it finds no violation and injects every fault kind it
//! schedules; the same seed gives the same schedule; on deliberately broken
//! backends (double grants, with and without fencing) it reports the
//! violations; on a backend without fencing, frozen clients' late writes
//! are reported as an expected negative control, not a failure.
//!
//! The tests run in parallel; the file takes about 25 s.
//!
//! With `DISTLOCK_PARTITIONS=all` (as root, with iproute2), two more run
//! the soak with its partitions cut in the kernel (`run_soak_in_lab`) on an
//! etcd whose server and workers each have a network namespace: a clean
//! run, and a run whose clients believe their leases last an hour longer
//! than they do, which the soak must report (about 35 s each).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::deploy::{self, DeployedTarget, Opener};
use conformance::doubles::{Flaw, FlawedTarget, HourLongerLeases, flawed_opener, rogue_lease};
use conformance::scenarios::all_partitions_selected;
use conformance::soak::{
    FaultKind, SoakConfig, SoakLab, SoakReport, plan, run_soak, run_soak_in_lab,
};
use conformance::{MemoryTarget, OrSkip, Target};
use lock_core::{Capabilities, FencingScope, FencingToken, Lease, LockBackend, LockKey};

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
    let Some(deployment) = deploy::start("etcd").await.or_skip() else {
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

/// A memory backend that, every fourth time it finds a key held, grants it
/// anyway (a lease the real service knows nothing about, with a low token
/// that repeats, so tokens also go backwards), optionally claiming to have
/// no fencing.
#[derive(Debug)]
struct DoubleGranting {
    calls: AtomicU64,
    fencing: bool,
    fake_tokens: AtomicU64,
}

impl DoubleGranting {
    fn target(fencing: bool) -> Arc<dyn Target> {
        Arc::new(FlawedTarget::new(Self {
            calls: AtomicU64::new(0),
            fencing,
            fake_tokens: AtomicU64::new(0),
        }))
    }
}

impl Flaw for DoubleGranting {
    fn name(&self) -> &'static str {
        "double-granting"
    }

    fn capabilities(&self, inner: Capabilities) -> Capabilities {
        if self.fencing {
            inner
        } else {
            Capabilities {
                fencing: FencingScope::None,
                ..inner
            }
        }
    }

    fn contended(&self, key: &LockKey, ttl: Duration) -> Option<Lease> {
        if !self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(4) {
            return None;
        }
        let token = self.fake_tokens.fetch_add(1, Ordering::Relaxed) % 2 + 1;
        rogue_lease(key, ttl, FencingToken::new(token)).ok()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_grants_twice_is_reported() {
    // No faults at all: every violation is the backend's.
    let mut config = SoakConfig::new(Duration::from_secs(6), 3);
    config.kinds = Some(Vec::new());
    let fenced = run_soak(DoubleGranting::target(true), None, &config)
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
    let unfenced = run_soak(DoubleGranting::target(false), None, &config)
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
struct Unfenced;

impl Flaw for Unfenced {
    fn name(&self) -> &'static str {
        "unfenced"
    }

    fn capabilities(&self, inner: Capabilities) -> Capabilities {
        Capabilities {
            fencing: FencingScope::None,
            ..inner
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_clients_without_fencing_are_a_negative_control() {
    let mut config = SoakConfig::new(Duration::from_secs(15), 5);
    config.kinds = Some(vec![FaultKind::ClientFreeze]);
    // One key: a frozen holder's key is soon taken by someone else.
    config.keys = 1;
    let report = run_soak(Arc::new(FlawedTarget::new(Unfenced)), None, &config)
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

/// A soak of `config` on an etcd started in a lab, its clients opened
/// with `open` on hosts of their own, its partitions cut in the kernel.
async fn etcd_lab_soak(open: Opener, config: &SoakConfig) -> Option<SoakReport> {
    let (deployment, hosts) = deploy::start_in_lab("etcd", config.workers)
        .await
        .or_skip()?;
    let lab = SoakLab::from_hosts(&hosts, "etcd", &open);
    let target = Arc::new(DeployedTarget::new(deployment, open));
    let report = run_soak_in_lab(target, lab, config)
        .await
        .expect("soak runs");
    println!("{}", report.table());
    Some(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_soak_with_kernel_partitions_is_clean() {
    if !all_partitions_selected() {
        return;
    }
    let mut config = SoakConfig::new(Duration::from_secs(30), 13);
    config.long_hold_every = 4;
    let Some(report) = etcd_lab_soak(etcd_opener(), &config).await else {
        return;
    };
    assert!(report.kinds.contains(&FaultKind::ClientPartition));
    assert!(!report.kinds.contains(&FaultKind::ClientLatency));
    assert!(
        report.client_links.starts_with("kernel"),
        "{}",
        report.table()
    );
    assert_clean(&report);
}

/// Clients told an hour late that their leases ended, as in the
/// partition scenarios: their promised windows run on while etcd frees
/// the key and grants it to another worker. Only client partitions are
/// injected, and they excuse no double grant. (The flaw does not need
/// the cut here: the scheduler renews two thirds of a TTL before the
/// deadline it was given, an hour away, so any long hold outlives the
/// server's lease; a run without faults reports it too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_told_too_late_is_caught_by_a_kernel_partition_soak() {
    if !all_partitions_selected() {
        return;
    }
    let mut config = SoakConfig::new(Duration::from_secs(30), 17);
    config.kinds = Some(vec![FaultKind::ClientPartition]);
    config.long_hold_every = 4;
    let open = flawed_opener(etcd_opener(), Arc::new(HourLongerLeases));
    let Some(report) = etcd_lab_soak(open, &config).await else {
        return;
    };
    assert!(
        report.faults["client_partition"].injected > 0,
        "{}",
        report.table()
    );
    assert!(report.fails_run(), "{}", report.table());
    assert_eq!(report.verdict, "VIOLATION");
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.what == "overlap" && !v.expected),
        "{}",
        report.table()
    );
}

/// With a real fenced store beside the resource, the late writes of frozen
/// clients are refused by the store, and a store that accepts them (no
/// check) fails the run: the store's verdict is observed, not assumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_store_is_judged_by_what_it_answers() {
    use conformance::fencing::MemoryFenced;
    use conformance::soak::FenceStore;
    let run = |store: MemoryFenced| async move {
        let mut config = SoakConfig::new(Duration::from_secs(8), 5);
        config.kinds = Some(vec![FaultKind::ClientFreeze]);
        config.keys = 1;
        config.fence_store = Some(FenceStore(Arc::new(store)));
        let target: Arc<dyn Target> = Arc::new(MemoryTarget::new());
        run_soak(target, None, &config).await.expect("soak runs")
    };
    let checked = run(MemoryFenced::new()).await;
    println!("{}", checked.table());
    let store = checked.fence_store.as_ref().expect("a store report");
    assert!(
        store.refused > 0,
        "no late write reached the store\n{}",
        checked.table()
    );
    assert_eq!(
        store.accepted_stale + store.refused_admitted,
        0,
        "{}",
        checked.table()
    );
    assert!(!checked.fails_run(), "{}", checked.table());

    let unchecked = run(MemoryFenced::unchecked()).await;
    println!("{}", unchecked.table());
    let store = unchecked.fence_store.as_ref().expect("a store report");
    assert!(store.accepted_stale > 0, "{}", unchecked.table());
    assert!(unchecked.fails_run(), "{}", unchecked.table());
}
