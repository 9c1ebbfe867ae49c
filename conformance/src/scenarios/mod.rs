//! Fault scenarios: what each backend does when holders crash or pause,
//! clients are partitioned, servers restart, the network slows down,
//! replies are lost, and acquires are cancelled by the thousand. Each is
//! judged from what clients observed (and, where it applies, the history
//! checker), and reports figures for the comparison.
//!
//! The failover and node-loss scenarios (`replica_failover`,
//! `minority_down`, `majority_down`) run where the target has the ability
//! ([`Target::fail_over`], [`Target::stop_nodes`]), whatever the backend.
//!
//! Scenarios where a backend *cannot* be safe are kept as negative
//! controls: there the violation must be seen and is reported as
//! `flagged`; a negative control that shows nothing is a failure of the
//! instrument.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lock_core::LockBackendExt;
use lock_core::{FencingToken, Lease, LeaseKind, LockBackend, LockKey, OwnerId, TtlModel};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, timeout};

use crate::harness::Target;
use crate::history::{Op, Recorder};
use crate::resource::{RESOURCE_ENV, ResourceServer};

mod cluster;
mod holder;
mod kinds;
mod partition;
mod server;

pub use cluster::*;
pub use holder::*;
pub use kinds::*;
pub use partition::*;
pub use server::*;

/// A scenario's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Nothing unsafe happened.
    Safe,
    /// Something unsafe happened where the backend promises safety (or a
    /// negative control showed nothing: the instrument failed).
    Violation,
    /// A negative control: the expected violation was seen and reported.
    Flagged,
    /// Not applicable to this backend or target.
    Skipped,
}

/// One scenario's result.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    /// The verdict.
    pub verdict: Verdict,
    /// Whether this is a negative control for this backend.
    pub negative_control: bool,
    /// What happened, in words.
    pub detail: String,
    /// Figures (milliseconds, counts).
    #[serde(flatten)]
    pub figures: BTreeMap<String, Value>,
}

impl ScenarioReport {
    fn skipped(why: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Skipped,
            negative_control: false,
            detail: why.into(),
            figures: BTreeMap::new(),
        }
    }

    fn judged(
        negative_control: bool,
        violated: bool,
        detail: String,
        figures: BTreeMap<String, Value>,
    ) -> Self {
        let verdict = match (negative_control, violated) {
            (false, false) => Verdict::Safe,
            (false, true) | (true, false) => Verdict::Violation,
            (true, true) => Verdict::Flagged,
        };
        let detail = if negative_control && !violated {
            format!(
                "negative control NOT flagged (the unsafe outcome was expected but not observed): {detail}"
            )
        } else {
            detail
        };
        Self {
            verdict,
            negative_control,
            detail,
            figures,
        }
    }

    /// A report judged on several counts at once: `violations` names each
    /// unsafe outcome found where the backend promises safety, and
    /// `negative_control` is `Some(seen)` where the scenario is a negative
    /// control for this backend, `seen` being whether its expected unsafe
    /// outcome was observed. Any violation fails the scenario, negative
    /// control or not; a negative control that saw nothing fails it too
    /// (the instrument failed).
    fn from_findings(
        negative_control: Option<bool>,
        violations: &[String],
        detail: String,
        figures: BTreeMap<String, Value>,
    ) -> Self {
        let verdict = match (violations.is_empty(), negative_control) {
            (false, _) | (true, Some(false)) => Verdict::Violation,
            (true, Some(true)) => Verdict::Flagged,
            (true, None) => Verdict::Safe,
        };
        let mut text = String::new();
        if negative_control == Some(false) {
            text.push_str(
                "negative control NOT flagged (the unsafe outcome was expected but not observed): ",
            );
        }
        if !violations.is_empty() {
            text.push_str(&format!("VIOLATION: {}; ", violations.join("; ")));
        }
        text.push_str(&detail);
        Self {
            verdict,
            negative_control: negative_control.is_some(),
            detail: text,
            figures,
        }
    }

    fn failed(detail: String) -> Self {
        Self {
            verdict: Verdict::Violation,
            negative_control: false,
            detail,
            figures: BTreeMap::new(),
        }
    }

    /// Whether this result fails a run (a violation where safety is
    /// promised, or a negative control that was not flagged).
    pub fn fails_run(&self) -> bool {
        self.verdict == Verdict::Violation
    }
}

/// Builds the command of a lock-holder process: given a backend URL, a key
/// and a TTL, it must take the lock, keep it (renewed) while it lives, and
/// exit with status 76 when it learns the lock was lost while its work ran
/// (as `distlock run --on-lost term KEY -- cmd` does). When its environment
/// has [`crate::resource::RESOURCE_ENV`], the work it does under the lock
/// is to report its lease to that resource once (a line `lease <handle>`,
/// see [`LEASE_REPORT`]; the handle is what `distlock run` gives its
/// command in `DISTLOCK_HANDLE`, and the pause scenario bounds the
/// holder's deadline with its TTL), then send its fencing token every
/// ~20 ms (see [`crate::resource`]); [`HOLDER_WORK`] is such a command for
/// `distlock run`.
pub type HolderCommand = Arc<dyn Fn(&str, &str, Duration) -> Command + Send + Sync>;

/// The work of a `distlock run` holder, as a `bash -c` script: when there
/// is a resource, report the lease (`lease $DISTLOCK_HANDLE`) and then send
/// the fencing token to it every 20 ms; sleep otherwise.
pub const HOLDER_WORK: &str = r#"r="${DISTLOCK_TEST_RESOURCE:-}"; [ -z "$r" ] && exec sleep 600; echo "lease ${DISTLOCK_HANDLE:-}" >"/dev/tcp/${r%:*}/${r##*:}" 2>/dev/null; while :; do echo "$DISTLOCK_FENCING_TOKEN" >"/dev/tcp/${r%:*}/${r##*:}" 2>/dev/null; sleep 0.02; done"#;

/// The exit status of a holder that learnt its lock was lost while its
/// work ran (`distlock run`'s; 77 says the lock was lost before the work
/// started).
pub const EXIT_LOCK_LOST: i32 = 76;

/// The first word of the line a holder's work sends to report its lease
/// (followed by the lease's handle, [`Lease::to_handle`]). Such a line is
/// a report, not a write to the resource.
pub const LEASE_REPORT: &str = "lease";

/// The handle of a lease report line, or `None` for a write.
fn lease_report(line: &str) -> Option<&str> {
    line.strip_prefix(LEASE_REPORT)
        .filter(|rest| rest.is_empty() || rest.starts_with(' '))
        .map(str::trim)
}

/// The lease the holder's work reported (its first parsable report).
fn reported_lease(arrivals: &[crate::resource::Arrival]) -> Option<Lease> {
    arrivals
        .iter()
        .filter_map(|a| lease_report(&a.line))
        .find_map(|handle| Lease::from_handle(handle).ok())
}

/// The holder command of a `distlock` binary at `exe`: `distlock --url URL
/// run --on-lost term --kill-after 1s --ttl TTL KEY -- bash -c WORK`
/// (`work` is normally [`HOLDER_WORK`]).
pub fn distlock_run_holder(exe: std::path::PathBuf, work: String) -> HolderCommand {
    distlock_run_holder_kind(exe, work, LeaseKind::Exclusive)
}

/// As [`distlock_run_holder`], taking a grant of `kind` (`--write`,
/// `--semaphore N --permits M`, see [`run_flags`]).
pub fn distlock_run_holder_kind(
    exe: std::path::PathBuf,
    work: String,
    kind: LeaseKind,
) -> HolderCommand {
    let flags = run_flags(kind);
    Arc::new(move |url: &str, key: &str, ttl: Duration| {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--url",
            url,
            "run",
            "--on-lost",
            "term",
            "--kill-after",
            "1s",
        ])
        .arg("--ttl")
        .arg(format!("{}ms", ttl.as_millis()))
        .args(&flags)
        .args([key, "--", "bash", "-c", &work]);
        cmd
    })
}

/// What the scenarios run against.
#[derive(Clone)]
pub struct ScenarioEnv {
    /// The backend under test.
    pub target: Arc<dyn Target>,
    /// How to start a holder process, for the crash and pause scenarios.
    pub holder: Option<HolderCommand>,
    /// Fewer repetitions and a smaller cancellation storm.
    pub quick: bool,
    /// TTL used (raised to the backend's minimum).
    pub ttl: Duration,
}

impl std::fmt::Debug for ScenarioEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScenarioEnv")
            .field("target", &self.target.name())
            .field("quick", &self.quick)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

type ScenarioFn =
    for<'a> fn(&'a ScenarioEnv) -> Pin<Box<dyn Future<Output = ScenarioReport> + Send + 'a>>;

/// The one table of scenarios: their names (in report order) and the
/// dispatch come from the same list.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// Every scenario's name, in report order.
        pub const SCENARIOS: &[&str] = &[$(stringify!($name)),*];

        const TABLE: &[(&str, ScenarioFn)] = &[$((stringify!($name), |env| Box::pin($name(env)))),*];
    };
}

scenarios!(
    holder_killed,
    holder_paused,
    client_partitioned,
    server_restarted,
    latency_injected,
    release_reply_lost,
    cancellation_storm,
    replica_failover,
    minority_down,
    majority_down,
);

/// Runs one scenario by name.
pub async fn run_scenario(name: &str, env: &ScenarioEnv) -> ScenarioReport {
    let fut = async {
        match TABLE.iter().find(|(n, _)| *n == name) {
            Some((_, run)) => run(env).await,
            None => ScenarioReport::failed(format!("unknown scenario {name:?}")),
        }
    };
    match timeout(Duration::from_secs(180), fut).await {
        Ok(report) => report,
        Err(_) => {
            let _ = env.target.heal().await;
            let _ = timeout(Duration::from_secs(120), env.target.restart_nodes()).await;
            ScenarioReport::failed(format!("scenario {name} did not finish within 180 s"))
        }
    }
}

/// Runs every scenario, one after another.
pub async fn run_all(env: &ScenarioEnv) -> BTreeMap<String, ScenarioReport> {
    let mut out = BTreeMap::new();
    for name in SCENARIOS {
        out.insert((*name).to_owned(), run_scenario(name, env).await);
    }
    out
}

fn ms(d: Duration) -> Value {
    json!((d.as_secs_f64() * 1e4).round() / 10.0)
}

fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[i.min(samples.len() - 1)]
}

fn key(name: &str) -> LockKey {
    LockKey::new(format!(
        "scenario-{}/{name}",
        &OwnerId::random().to_hex()[..8]
    ))
    .expect("valid key")
}

/// A scenario's result, with an error turned into a failed report.
fn finish(result: Result<ScenarioReport, String>) -> ScenarioReport {
    result.unwrap_or_else(ScenarioReport::failed)
}

const NO_PROXY: &str = "target cannot put a proxy in front of the server";

/// A client behind a fault proxy, when the target can make one.
async fn proxied_client(
    env: &ScenarioEnv,
) -> Result<Option<(Arc<dyn LockBackend>, crate::proxy::FaultProxy)>, String> {
    env.target.proxied_client().await.map_err(|e| e.to_string())
}

async fn client(env: &ScenarioEnv) -> Result<Arc<dyn LockBackend>, String> {
    env.target
        .client()
        .await
        .map_err(|e| format!("client: {e}"))
}

/// How long a lock can outlive a dead holder: the TTL for per-lease
/// backends, the session's TTL (not known here: bounded generously) for
/// per-session ones.
fn free_bound(env: &ScenarioEnv, backend: &dyn LockBackend) -> Duration {
    match backend.capabilities().ttl_model {
        TtlModel::PerLease => env.ttl * 2 + Duration::from_secs(2),
        _ => Duration::from_secs(30),
    }
}

struct Holder {
    child: std::process::Child,
    pid: libc::pid_t,
}

impl Holder {
    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid, sig);
        }
    }

    /// The process groups of the holder's children (`distlock run` starts
    /// its command in a group of its own), read from `/proc`.
    fn child_groups(&self) -> Vec<libc::pid_t> {
        let mut out = Vec::new();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return out;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            out.extend(
                children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<libc::pid_t>().ok()),
            );
        }
        out
    }

    /// Waits until every thread of the holder process is stopped (state
    /// `T` in `/proc/PID/task/*/stat`): from then on nothing it sends can
    /// leave it. An error when the process ended, or was not seen stopped
    /// within `patience` (with the thread states last seen).
    async fn wait_stopped(&self, patience: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let states = thread_states(self.pid);
            if !states.is_empty() && states.iter().all(|s| matches!(s, 'T' | 't')) {
                return Ok(());
            }
            if states.is_empty() || states.iter().any(|s| matches!(s, 'Z' | 'X')) {
                return Err(
                    "the holder process ended before it could be stopped (it lost its lock early?)"
                        .to_owned(),
                );
            }
            let waited = start.elapsed();
            if waited >= patience {
                let states: String = states.into_iter().collect();
                return Err(format!(
                    "the holder process was not seen stopped within {patience:?} of SIGSTOP (thread states {states:?})"
                ));
            }
            // A stop takes microseconds: look again at once for a while
            // (the caller's clock reading waits for this), then calmly.
            if waited < Duration::from_millis(5) {
                tokio::task::yield_now().await;
            } else {
                sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// Signals every child's process group.
    fn signal_children(&self, groups: &[libc::pid_t], sig: libc::c_int) {
        for group in groups {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(-group, sig);
            }
        }
    }

    fn kill_group(&self) {
        // SAFETY: as above; the holder leads its own process group.
        unsafe {
            libc::kill(-self.pid, libc::SIGKILL);
        }
    }
}

/// The state of each thread of `pid` (`R`, `S`, `D`, `T`...), from
/// `/proc/PID/task/*/stat`; none when the process is gone.
fn thread_states(pid: libc::pid_t) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        // A thread that ended meanwhile has no stat to read: skip it.
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        // `pid (comm) S ...`: the state follows the last parenthesis (the
        // command name may hold any character).
        .filter_map(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .collect()
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill_group();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a holder process (writing to `resource`, when given, while it
/// holds) and waits until `inspect` shows the key held.
async fn start_holder(
    env: &ScenarioEnv,
    observer: &dyn LockBackend,
    key: &LockKey,
    resource: Option<&ResourceServer>,
) -> Result<Option<(Holder, Option<FencingToken>)>, String> {
    let (Some(make), Some(url)) = (&env.holder, env.target.url()) else {
        return Ok(None);
    };
    let mut cmd = make(&url, key.as_str(), env.ttl);
    if let Some(resource) = resource {
        cmd.env(RESOURCE_ENV, resource.addr().to_string());
    }
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let child = cmd
        .spawn()
        .map_err(|e| format!("starting the holder process: {e}"))?;
    let pid = libc::pid_t::try_from(child.id()).map_err(|e| e.to_string())?;
    let mut holder = Holder { child, pid };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(info)) = observer.inspect(key).await {
            return Ok(Some((holder, info.token)));
        }
        if let Ok(Some(status)) = holder.child.try_wait() {
            return Err(format!("holder process exited early with {status}"));
        }
        if Instant::now() >= deadline {
            return Err("holder process never took the lock".into());
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// A client made with retries (a cluster may still be electing a leader,
/// a promoted replica may still be starting to accept connections).
async fn client_within(
    env: &ScenarioEnv,
    patience: Duration,
) -> Result<Arc<dyn LockBackend>, String> {
    let until = Instant::now() + patience;
    loop {
        match env.target.client().await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= until => return Err(format!("client: {e}")),
            Err(_) => sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Releases with a bound; the release's start ends the promised window
/// whatever its outcome.
async fn recorded_release(backend: &dyn LockBackend, rec: &Recorder, lease: &Lease) -> bool {
    let release = crate::recording::recorded_release(backend, rec, lease);
    match timeout(Duration::from_secs(10), release).await {
        Ok(Ok(held)) => held,
        Ok(Err(_)) => false,
        Err(_) => {
            rec.failed(Op::Release, lease.key(), Some(lease.token()));
            false
        }
    }
}

/// Restores every node a scenario killed, reporting a failure as a
/// violation of the scenario.
async fn restart_all(env: &ScenarioEnv) -> Result<Duration, String> {
    let started = Instant::now();
    match timeout(Duration::from_secs(150), env.target.restart_nodes()).await {
        Ok(Ok(())) => Ok(started.elapsed()),
        Ok(Err(e)) => Err(format!("restarting the killed nodes: {e}")),
        Err(_) => Err("restarting the killed nodes took over 150 s".into()),
    }
}
