//! The randomized fault soak on a three-node JetStream cluster (the
//! bucket's stream with replicas 3) whose nodes and workers each have a
//! network namespace of a lab: partitions are cut in the kernel (a node
//! cut from its peers, a worker cut off, a worker cut from the one node
//! it knows), beside stream leader kills, node restarts, server pauses and
//! client freezes. Only with `DISTLOCK_PARTITIONS=all` (root, iproute2);
//! 30 s by default, `DISTLOCK_SOAK_SECS` for longer (the figures in
//! docs/backends/nats.md are from a 600 s run).

mod common;

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::deploy::{self, DeployedTarget};
use conformance::scenarios::all_partitions_selected;
use conformance::soak::{FaultKind, SoakConfig, SoakLab, run_soak_in_lab};

/// The run's length: `DISTLOCK_SOAK_SECS` seconds, or 30.
fn duration() -> Duration {
    let secs = std::env::var("DISTLOCK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cluster_soak_with_kernel_partitions_is_safe() {
    if !all_partitions_selected() {
        return;
    }
    let mut config = SoakConfig::new(duration(), 42);
    // Holds across renewals, so that a cut lands while a holder depends
    // on them (as `distlock-compare compare --soak --netns` does).
    config.long_hold_every = 4;
    let Some((deployment, hosts)) = deploy::start_in_lab("nats-cluster", config.workers)
        .await
        .or_skip()
    else {
        return;
    };
    let lab = SoakLab::from_hosts(&hosts, "nats-cluster", &common::opener());
    let target = Arc::new(DeployedTarget::new(deployment, common::opener()));
    let report = run_soak_in_lab(target, lab, &config)
        .await
        .expect("soak runs");
    let table = report.table();
    println!("{table}");
    // The servers went with the report's target; the lab goes last.
    drop(hosts);
    for kind in [
        FaultKind::ClientPartition,
        FaultKind::MemberPartition,
        FaultKind::MemberClientPartition,
        FaultKind::LeaderKill,
    ] {
        assert!(
            report.kinds.contains(&kind),
            "{kind:?} not scheduled\n{table}"
        );
    }
    assert!(report.client_links.starts_with("kernel"), "{table}");
    for kind in &report.kinds {
        let injected = report.faults.get(kind.as_str()).map_or(0, |s| s.injected);
        assert!(
            injected > 0,
            "{kind} was scheduled but never injected\n{table}"
        );
    }
    assert!(!report.fails_run(), "{table}");
    assert_eq!(report.violations.len(), 0, "{table}");
    assert!(report.check.is_safe_with_fencing(), "{table}");
    assert_eq!(report.lost_increments, 0, "{table}");
    assert!(report.grants > 10, "{table}");
}
