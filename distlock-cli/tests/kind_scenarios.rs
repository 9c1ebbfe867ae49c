//! The pause scenario with a real `distlock run --write` holder process
//! against a real redis-server, the write side of a read-write lock in the
//! mutex's place: the paused writer's late writes are refused by token
//! order; a writer that lies about its token is caught.

use std::sync::Arc;
use std::time::Duration;

use conformance::OrSkip;
use conformance::deploy::{self, DeployedTarget, Opener};
use conformance::scenarios::{self, HOLDER_WORK, ScenarioEnv, Verdict};
use lock_core::LeaseKind;

async fn env(work: &str, kind: LeaseKind) -> Option<ScenarioEnv> {
    let opener: Opener =
        Arc::new(|url: String| Box::pin(async move { distlock::backend::open(&url).await }));
    let deployment = deploy::start("redis").await.or_skip()?;
    let base = ScenarioEnv {
        target: Arc::new(DeployedTarget::new(deployment, opener)),
        holder: None,
        quick: true,
        ttl: Duration::from_secs(1),
    };
    let holder = scenarios::distlock_run_holder_kind(
        env!("CARGO_BIN_EXE_distlock").into(),
        work.to_owned(),
        kind,
    );
    Some(scenarios::for_kind(&base, kind, Some(holder)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_writers_late_writes_are_refused() {
    let Some(env) = env(HOLDER_WORK, LeaseKind::Write).await else {
        return;
    };
    let report = scenarios::holder_paused(&env).await;
    assert_eq!(report.verdict, Verdict::Safe, "{}", report.detail);
    assert!(
        report.figures["writes_after_resume"].as_u64().unwrap_or(0) > 0,
        "{}",
        report.detail
    );
    let killed = scenarios::holder_killed(&env).await;
    assert_eq!(killed.verdict, Verdict::Safe, "{}", killed.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holder_with_a_lying_token_is_caught() {
    let lying =
        format!("DISTLOCK_FENCING_TOKEN=$((DISTLOCK_FENCING_TOKEN + 1000000)); {HOLDER_WORK}");
    let Some(env) = env(&lying, LeaseKind::Permits { count: 1, limit: 1 }).await else {
        return;
    };
    let report = scenarios::holder_paused(&env).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
}
