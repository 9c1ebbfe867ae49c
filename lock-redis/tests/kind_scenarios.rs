//! The fault scenarios of `conformance::scenarios` that need no holder
//! process (client partitioned through a fault proxy, server killed and
//! restarted), run with the write side of a read-write lock and with a
//! semaphore of one permit in the mutex's place, on one server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use conformance::scenarios::{self, ScenarioEnv, Verdict};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kind_scenarios_on_a_single_server() {
    let Some(target) = common::deployed("redis").await else {
        return;
    };
    let caps = lock_redis::capabilities(&lock_redis::RedisConfig::from_url(&target.url()).unwrap());
    let base = ScenarioEnv {
        target: Arc::new(target),
        holder: None,
        quick: true,
        ttl: Duration::from_secs(1),
    };
    let kinds = scenarios::scenario_kinds(&caps);
    assert_eq!(kinds.len(), 2, "the driver claims both shapes");
    let mut failed = Vec::new();
    for kind in kinds {
        let env = scenarios::for_kind(&base, kind, None);
        for name in scenarios::KIND_SCENARIOS {
            if name.starts_with("holder_") {
                // They need a holder process (`distlock run --write`),
                // which this crate does not build.
                continue;
            }
            let report = scenarios::run_scenario(name, &env).await;
            println!(
                "{name}[{}] {:?}: {}",
                kind.code(),
                report.verdict,
                report.detail
            );
            if report.fails_run() || report.verdict == Verdict::Skipped {
                failed.push(format!("{name}[{}]: {}", kind.code(), report.detail));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "kind scenarios failed or skipped: {failed:#?}"
    );
}
