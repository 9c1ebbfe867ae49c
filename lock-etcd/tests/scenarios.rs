//! The fault scenarios of `conformance::scenarios` with the write side of a
//! read-write lock and a semaphore of one permit in the mutex's place, on
//! a single etcd member: holder process killed and paused (the
//! `lock-etcd-holder` binary, `src/bin/holder.rs`), client partitioned
//! (through the deployment's fault proxy), server killed and restarted.
//! The scenarios' history checker judges each run.

mod common;

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::deploy::{self, DeployedTarget};
use conformance::scenarios::{
    HolderCommand, KIND_SCENARIOS, ScenarioEnv, Verdict, for_kind, run_scenario, scenario_kinds,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kind_scenarios_on_a_single_member() {
    let Some(deployment) = deploy::start("etcd").await.or_skip() else {
        return;
    };
    let base = ScenarioEnv {
        target: Arc::new(DeployedTarget::new(deployment, common::suite_opener())),
        holder: None,
        quick: true,
        ttl: Duration::from_secs(1),
    };
    let kinds = scenario_kinds(&lock_etcd::capabilities());
    assert_eq!(kinds.len(), 2, "the driver claims both shapes");
    let mut failed = Vec::new();
    for kind in kinds {
        let holder = holder_command(&kind.code());
        let with_holder = holder.is_some();
        let env = for_kind(&base, kind, holder);
        for name in KIND_SCENARIOS {
            if !with_holder && name.starts_with("holder_") {
                continue;
            }
            let report = run_scenario(name, &env).await;
            println!(
                "{name}[{}] {:?}: {}",
                kind.code(),
                report.verdict,
                report.detail
            );
            if report.fails_run() || report.verdict == Verdict::Skipped {
                failed.push(format!("{name}[{}]", kind.code()));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "kind scenarios failed or skipped: {failed:?}"
    );
}

/// The holder binary (`src/bin/holder.rs`) taking grants of the kind
/// coded `kind`.
fn holder_command(kind: &str) -> Option<HolderCommand> {
    let holder = std::path::PathBuf::from(env!("CARGO_BIN_EXE_lock-etcd-holder"));
    let kind = kind.to_owned();
    Some(Arc::new(move |url: &str, key: &str, ttl: Duration| {
        let mut cmd = std::process::Command::new(&holder);
        cmd.arg(url)
            .arg(key)
            .arg(ttl.as_millis().to_string())
            .arg(&kind);
        cmd
    }))
}
