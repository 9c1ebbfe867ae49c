//! The pause and kill scenarios with real holder processes (`distlock
//! run`) on a SQLite file, judged from the writes that reached the
//! resource, the grants and the holder's exit: the honest holder's late
//! write is refused by token order, and each finding has a broken variant
//! that must be caught: a holder that carries a token above the next
//! holder's (what a backend whose tokens went backwards would hand out), a
//! backend that grants the key inside the paused holder's lease, a holder
//! that never reports its loss (`--on-lost ignore`), and, without fencing,
//! a negative control that sees nothing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::Target;
use conformance::deploy::Opener;
use conformance::doubles::{Flaw, flawed_opener, rogue_lease};
use conformance::scenarios::{
    self, HOLDER_WORK, HolderCommand, ScenarioEnv, ScenarioReport, Verdict,
};
use lock_core::{Capabilities, FencingScope, FencingToken, Lease, LockBackend, LockError, LockKey};

struct SqliteFile {
    url: String,
    open: Opener,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl Target for SqliteFile {
    fn name(&self) -> String {
        "sqlite".into()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        (self.open)(self.url.clone()).await
    }
    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }
}

fn opener() -> Opener {
    Arc::new(|url: String| Box::pin(async move { distlock::backend::open(&url).await }))
}

/// A SQLite file whose scenario clients (not the holder process, which is
/// the real `distlock` binary) are opened with `open`.
fn sqlite_with(open: Opener) -> Arc<dyn Target> {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    Arc::new(SqliteFile {
        url,
        open,
        _dir: dir,
    })
}

fn sqlite() -> Arc<dyn Target> {
    sqlite_with(opener())
}

fn holder(work: String) -> HolderCommand {
    scenarios::distlock_run_holder(env!("CARGO_BIN_EXE_distlock").into(), work)
}

/// A `distlock run --on-lost ignore` holder: when the lock is lost it lets
/// the command run on and exits with the command's status, never 76.
fn ignoring_holder() -> HolderCommand {
    let exe = env!("CARGO_BIN_EXE_distlock");
    Arc::new(move |url: &str, key: &str, ttl: Duration| {
        let mut cmd = std::process::Command::new(exe);
        cmd.args(["--url", url, "run", "--on-lost", "ignore"])
            .arg("--ttl")
            .arg(format!("{}ms", ttl.as_millis()))
            .args([key, "--", "bash", "-c", HOLDER_WORK]);
        cmd
    })
}

fn env(work: String) -> ScenarioEnv {
    ScenarioEnv {
        target: sqlite(),
        holder: Some(holder(work)),
        quick: true,
        ttl: Duration::from_secs(1),
    }
}

/// The scenario clients see the backend as one without fencing tokens (as
/// Redlock is): the pause scenario becomes a negative control.
#[derive(Debug)]
struct NoFencing;

impl Flaw for NoFencing {
    fn capabilities(&self, inner: Capabilities) -> Capabilities {
        Capabilities {
            fencing: FencingScope::None,
            ..inner
        }
    }
}

fn unfenced(holder: HolderCommand) -> ScenarioEnv {
    ScenarioEnv {
        target: sqlite_with(flawed_opener(opener(), Arc::new(NoFencing))),
        holder: Some(holder),
        ..env(HOLDER_WORK.to_owned())
    }
}

fn figure(report: &ScenarioReport, name: &str) -> serde_json::Value {
    report
        .figures
        .get(name)
        .cloned()
        .unwrap_or_else(|| panic!("no figure {name}: {}", report.detail))
}

/// The report whole, for an assertion's message.
fn described(report: &ScenarioReport) -> String {
    format!("{}\n{:?}", report.detail, report.figures)
}

/// No grant inside the paused holder's window, where the scenario could
/// judge it: a stop it could not align to a renewal (a loaded machine
/// delays the stop past its budget) leaves the window an upper bound that
/// the next grant may overlap on a correct backend, and the scenario says
/// so instead of judging.
fn assert_no_judged_overlap(report: &ScenarioReport) {
    if figure(report, "exclusion_judged") == true {
        assert_eq!(
            figure(report, "overlapping_grants"),
            0,
            "{}",
            described(report)
        );
    } else {
        println!("exclusion not judged: {}", report.detail);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_paused_holders_late_write_is_refused_by_token_order() {
    let report = scenarios::holder_paused(&env(HOLDER_WORK.to_owned())).await;
    println!("{}\n{:?}", report.detail, report.figures);
    assert_eq!(report.verdict, Verdict::Safe, "{}", report.detail);
    assert_no_judged_overlap(&report);
    assert_eq!(figure(&report, "lost_signal_reported"), true);
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

/// A backend that hands the key to another client while the paused
/// holder's lease still runs (the grant is made up, with a token above any
/// real one, so fencing has nothing to say): the grant inside the holder's
/// window is a violation on its own.
#[derive(Debug)]
struct GrantsWhileHeld;

impl Flaw for GrantsWhileHeld {
    fn contended(&self, key: &LockKey, ttl: Duration) -> Option<Lease> {
        rogue_lease(key, ttl, FencingToken::new(1 << 40)).ok()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_inside_the_paused_holders_lease_is_caught() {
    let env = ScenarioEnv {
        target: sqlite_with(flawed_opener(opener(), Arc::new(GrantsWhileHeld))),
        ..env(HOLDER_WORK.to_owned())
    };
    let report = scenarios::holder_paused(&env).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert!(
        figure(&report, "overlapping_grants").as_u64().unwrap_or(0) > 0,
        "{}",
        report.detail
    );
    assert!(report.detail.contains("BEFORE"), "{}", report.detail);
}

/// A holder that never reports its loss (`--on-lost ignore`: its command
/// runs on and it exits with the command's status) is a violation even
/// though the tokens kept its late writes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_never_reports_its_loss_is_caught_even_when_fenced() {
    let env = ScenarioEnv {
        holder: Some(ignoring_holder()),
        ..env(HOLDER_WORK.to_owned())
    };
    let report = scenarios::holder_paused(&env).await;
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    let all = described(&report);
    assert_eq!(figure(&report, "lost_signal_reported"), false, "{all}");
    assert_eq!(figure(&report, "stale_writes_accepted"), 0, "{all}");
    assert_eq!(
        figure(&report, "current_holder_writes_rejected"),
        0,
        "{all}"
    );
    assert_no_judged_overlap(&report);
    assert!(
        report.detail.contains("did NOT report"),
        "{}",
        report.detail
    );
}

/// Without fencing, the paused holder's late write getting in is the
/// expected outcome: flagged as a negative control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_the_late_write_is_flagged() {
    let report = scenarios::holder_paused(&unfenced(holder(HOLDER_WORK.to_owned()))).await;
    assert!(report.negative_control, "{}", report.detail);
    assert_eq!(report.verdict, Verdict::Flagged, "{}", report.detail);
    assert!(
        figure(&report, "stale_writes_accepted")
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{}",
        report.detail
    );
}

/// Without fencing, a flagged stale write does not excuse a holder that
/// never reports its loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_a_holder_that_never_reports_its_loss_is_caught() {
    let report = scenarios::holder_paused(&unfenced(ignoring_holder())).await;
    assert!(report.negative_control, "{}", report.detail);
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert_eq!(figure(&report, "lost_signal_reported"), false);
    assert!(
        figure(&report, "stale_writes_accepted")
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{}",
        report.detail
    );
}

/// Without fencing, a resumed holder whose command writes nothing more
/// leaves the negative control with nothing observed: it fails (the
/// instrument failed), it does not pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fencing_a_negative_control_that_sees_nothing_fails() {
    // Reports its lease, writes once, then only sleeps.
    let once = r#"r="$DISTLOCK_TEST_RESOURCE"; echo "lease $DISTLOCK_HANDLE" >"/dev/tcp/${r%:*}/${r##*:}"; echo "$DISTLOCK_FENCING_TOKEN" >"/dev/tcp/${r%:*}/${r##*:}"; exec sleep 600"#;
    let report = scenarios::holder_paused(&unfenced(holder(once.to_owned()))).await;
    assert!(report.negative_control, "{}", report.detail);
    assert_eq!(report.verdict, Verdict::Violation, "{}", report.detail);
    assert!(report.detail.contains("NOT flagged"), "{}", report.detail);
    assert_eq!(figure(&report, "writes_after_resume"), 0);
    // The holder itself behaved: the failure is the instrument's.
    assert_eq!(figure(&report, "lost_signal_reported"), true);
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
