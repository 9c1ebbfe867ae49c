//! The shared conformance suite against real ZooKeeper servers started here:
//! a standalone server, and a 3-member ensemble.

mod common;
#[path = "conformance/guarded.rs"]
mod guarded;

use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_on_a_single_server() {
    common::run_suite_on(common::deployed("zookeeper").await).await;
}

/// The shared suite again with kazoo-named mutex nodes (`nodes=kazoo`):
/// grant, wait, release, renew, inspect and cleanup find our nodes under
/// that naming too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_with_kazoo_node_names() {
    common::run_suite_on(common::deployed_with("zookeeper", "nodes=kazoo").await).await;
}

/// Every shared fault scenario: holder process killed and paused (the
/// `lock-zk-holder` binary), partitioned client
/// (through a fault proxy), server killed and restarted, injected latency,
/// lost release reply, cancellation storm.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenarios_on_a_single_server() {
    let Some(target) = common::deployed("zookeeper").await else {
        return;
    };
    let holder = holder_command();
    let with_holder = holder.is_some();
    let env = conformance::scenarios::ScenarioEnv {
        target: Arc::new(target),
        holder,
        quick: true,
        ttl: std::time::Duration::from_secs(1),
    };
    let reports = conformance::scenarios::run_all(&env).await;
    let mut failed = Vec::new();
    for (name, report) in &reports {
        println!("{name:<20} {:?}: {}", report.verdict, report.detail);
        if report.fails_run() {
            failed.push(name.clone());
        }
    }
    assert!(failed.is_empty(), "scenarios failed: {failed:?}");
    // Failover and node-loss scenarios need a cluster: a single server
    // skips them (the ensemble has its own leader-kill test).
    const CLUSTER_ONLY: &[&str] = &["replica_failover", "minority_down", "majority_down"];
    for name in conformance::scenarios::SCENARIOS {
        if !with_holder && name.starts_with("holder_") {
            continue;
        }
        let skipped = reports[*name].verdict == conformance::scenarios::Verdict::Skipped;
        if CLUSTER_ONLY.contains(name) {
            assert!(skipped, "{name} ran on a single server");
        } else {
            assert!(!skipped, "{name} was skipped");
        }
    }
}

/// The holder scenarios, the partition and the server restart again with
/// the write side of a read-write lock, and a semaphore of one permit, in
/// the mutex's place (the holder process takes the same kind).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kind_scenarios_on_a_single_server() {
    let Some(target) = common::deployed("zookeeper").await else {
        return;
    };
    let caps = lock_zk::capabilities();
    let base = conformance::scenarios::ScenarioEnv {
        target: Arc::new(target),
        holder: None,
        quick: true,
        ttl: std::time::Duration::from_secs(1),
    };
    let kinds = conformance::scenarios::scenario_kinds(&caps);
    assert_eq!(kinds.len(), 2, "the driver claims both shapes");
    let mut failed = Vec::new();
    for kind in kinds {
        let holder = holder_command_of(&kind.code());
        let with_holder = holder.is_some();
        let env = conformance::scenarios::for_kind(&base, kind, holder);
        for name in conformance::scenarios::KIND_SCENARIOS {
            if !with_holder && name.starts_with("holder_") {
                continue;
            }
            let report = conformance::scenarios::run_scenario(name, &env).await;
            println!(
                "{name}[{}] {:?}: {}",
                kind.code(),
                report.verdict,
                report.detail
            );
            if report.fails_run() || report.verdict == conformance::scenarios::Verdict::Skipped {
                failed.push(format!("{name}[{}]", kind.code()));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "kind scenarios failed or skipped: {failed:?}"
    );
}

/// The holder process taking grants of the kind coded `kind`.
fn holder_command_of(kind: &str) -> Option<conformance::scenarios::HolderCommand> {
    holder_with(Some(kind.to_owned()))
}

/// The holder process (the `lock-zk-holder` binary).
fn holder_command() -> Option<conformance::scenarios::HolderCommand> {
    holder_with(None)
}

/// The holder process, given `kind` as its last argument when there is
/// one.
fn holder_with(kind: Option<String>) -> Option<conformance::scenarios::HolderCommand> {
    let holder = std::path::PathBuf::from(env!("CARGO_BIN_EXE_lock-zk-holder"));
    Some(Arc::new(
        move |url: &str, key: &str, ttl: std::time::Duration| {
            let mut cmd = std::process::Command::new(&holder);
            cmd.arg(url).arg(key).arg(ttl.as_millis().to_string());
            cmd.args(&kind);
            cmd
        },
    ))
}

/// The descriptor's capabilities (read from the URL alone) are what a
/// backend connected with that URL reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_capabilities_match_a_connected_backend() {
    let Some(target) = common::deployed("zookeeper").await else {
        return;
    };
    let url = common::with_options(&target.url(), common::CLIENT_OPTIONS);
    let endpoint = lock_core::endpoint::Endpoint::parse(&url).expect("a URL");
    let promised = (lock_zk::DRIVER.capabilities.expect("capabilities"))(&endpoint).expect("caps");
    let backend = (lock_zk::DRIVER.connect)(endpoint, lock_core::Requirements::none())
        .await
        .expect("connect");
    assert_eq!(promised, backend.capabilities());
}
