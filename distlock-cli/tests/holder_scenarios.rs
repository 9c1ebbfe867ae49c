//! The pause scenario with real holder processes (`distlock run`) on a
//! SQLite file, judged from the writes that reached the resource: the
//! honest holder's late write is refused by token order, and a holder that
//! carries a token above the next holder's (what a backend whose tokens
//! went backwards would hand out) is caught getting in.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::Target;
use conformance::scenarios::{self, HOLDER_WORK, HolderCommand, ScenarioEnv, Verdict};
use lock_core::{LockBackend, LockError};

struct SqliteFile {
    url: String,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl Target for SqliteFile {
    fn name(&self) -> String {
        "sqlite".into()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        distlock::open(&self.url).await
    }
    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

fn sqlite() -> Arc<dyn Target> {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    Arc::new(SqliteFile { url, _dir: dir })
}

fn holder(work: String) -> HolderCommand {
    scenarios::distlock_run_holder(env!("CARGO_BIN_EXE_distlock").into(), work)
}

fn env(work: String) -> ScenarioEnv {
    ScenarioEnv {
        target: sqlite(),
        holder: Some(holder(work)),
        quick: true,
        ttl: Duration::from_secs(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_paused_holders_late_write_is_refused_by_token_order() {
    let report = scenarios::holder_paused(&env(HOLDER_WORK.to_owned())).await;
    assert_eq!(report.verdict, Verdict::Safe, "{}", report.detail);
    let late = report.figures["writes_after_resume"].as_u64().unwrap_or(0);
    assert!(late > 0, "{}", report.detail);
    assert_eq!(
        report.figures["stale_writes_accepted"], 0,
        "{}",
        report.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_token_is_above_the_next_grants_is_caught() {
    let lying =
        format!("DISTLOCK_FENCING_TOKEN=$((DISTLOCK_FENCING_TOKEN + 1000000)); {HOLDER_WORK}");
    let report = scenarios::holder_paused(&env(lying)).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    // Its early writes carry the higher token, so the next holder's write
    // is refused although that holder is current; either symptom means the
    // tokens did not protect the resource.
    let symptoms = report.figures["stale_writes_accepted"]
        .as_u64()
        .unwrap_or(0)
        + report.figures["current_holder_writes_rejected"]
            .as_u64()
            .unwrap_or(0);
    assert!(symptoms > 0, "{}", report.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_command_stops_before_its_deadline() {
    let report = scenarios::holder_killed(&env(HOLDER_WORK.to_owned())).await;
    assert_eq!(report.verdict, Verdict::Safe, "{}", report.detail);
}

/// The broken variant of the check above: a holder whose work runs beside
/// `distlock run` (started by the same shell, given the token through a
/// file) instead of under it, so nothing stops the work when `distlock`
/// dies. `holder_killed` must catch the work writing past the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_work_outlives_it_is_caught() {
    let bin = env!("CARGO_BIN_EXE_distlock");
    let unsupervised: HolderCommand = Arc::new(move |url: &str, key: &str, ttl: Duration| {
        let script = format!(
            r#"tok=$(mktemp); ( while [ ! -s "$tok" ]; do sleep 0.01; done; DISTLOCK_FENCING_TOKEN=$(cat "$tok"); {HOLDER_WORK} ) & exec {bin} --url "$0" run --ttl {ttl}ms "$1" -- bash -c "echo \$DISTLOCK_FENCING_TOKEN >$tok; exec sleep 600""#,
            ttl = ttl.as_millis()
        );
        let mut cmd = std::process::Command::new("bash");
        cmd.args(["-c", &script, url, key]);
        cmd
    });
    let env = ScenarioEnv {
        holder: Some(unsupervised),
        ..env(HOLDER_WORK.to_owned())
    };
    let report = scenarios::holder_killed(&env).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert!(report.detail.contains("KEPT RUNNING"), "{}", report.detail);
}
