//! The shared fault scenarios on one nats-server and on the 3-node
//! cluster: holder process killed and paused (the `lock-nats-holder`
//! binary), partitioned client (through a fault proxy), server killed and
//! restarted, injected latency, lost release reply, cancellation storm; on
//! the cluster also the stream leader killed (failover) and nodes lost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use conformance::scenarios::{HolderCommand, SCENARIOS, ScenarioEnv, Verdict, run_all};

/// The holder process (the `lock-nats-holder` binary).
fn holder() -> HolderCommand {
    let holder = std::path::PathBuf::from(env!("CARGO_BIN_EXE_lock-nats-holder"));
    Arc::new(move |url: &str, key: &str, ttl: Duration| {
        let mut cmd = std::process::Command::new(&holder);
        cmd.arg(url).arg(key).arg(ttl.as_millis().to_string());
        cmd
    })
}

async fn run_on(kind: &str, cluster_only_skipped: bool) {
    let Some(target) = common::deployed(kind).await else {
        return;
    };
    let env = ScenarioEnv {
        target: Arc::new(target),
        holder: Some(holder()),
        quick: true,
        ttl: Duration::from_secs(2),
    };
    let reports = run_all(&env).await;
    let mut failed = Vec::new();
    for (name, report) in &reports {
        println!("{kind} {name:<20} {:?}: {}", report.verdict, report.detail);
        if report.fails_run() {
            failed.push(name.clone());
        }
    }
    assert!(failed.is_empty(), "scenarios failed on {kind}: {failed:?}");
    const CLUSTER_ONLY: &[&str] = &["replica_failover", "minority_down", "majority_down"];
    for name in SCENARIOS {
        let skipped = reports[*name].verdict == Verdict::Skipped;
        if CLUSTER_ONLY.contains(name) && cluster_only_skipped {
            assert!(skipped, "{name} ran on a single server");
        } else if name.starts_with("holder_") {
            assert!(!skipped, "{name} was skipped");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenarios_on_a_single_server() {
    run_on("nats", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenarios_on_a_three_node_cluster() {
    run_on("nats-cluster", false).await;
}
