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
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{FencingToken, Lease, LockBackend, LockClient, LockKey, OwnerId, TtlModel};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, timeout};

use crate::cases::recorded_acquire;
use crate::harness::Target;
use crate::history::{EventKind, FencedResource, History, Op, Recorder};
use crate::recording::{RecordingBackend, recorded_guard};
use crate::resource::{RESOURCE_ENV, ResourceServer};

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
/// exit with status 76 when it learns the lock was lost (as `distlock run
/// --on-lost term KEY -- cmd` does). When its environment has
/// [`RESOURCE_ENV`](crate::resource::RESOURCE_ENV), the work it does under
/// the lock is to send its fencing token to that resource every ~20 ms
/// (see [`crate::resource`]); [`HOLDER_WORK`] is such a command for
/// `distlock run`.
pub type HolderCommand = Arc<dyn Fn(&str, &str, Duration) -> Command + Send + Sync>;

/// The work of a `distlock run` holder, as a `bash -c` script: send the
/// fencing token to the resource every 20 ms when there is one, sleep
/// otherwise.
pub const HOLDER_WORK: &str = r#"r="${DISTLOCK_TEST_RESOURCE:-}"; [ -z "$r" ] && exec sleep 600; while :; do echo "$DISTLOCK_FENCING_TOKEN" >"/dev/tcp/${r%:*}/${r##*:}" 2>/dev/null; sleep 0.02; done"#;

/// The holder command of a `distlock` binary at `exe`: `distlock --url URL
/// run --on-lost term --kill-after 1s --ttl TTL KEY -- bash -c WORK`
/// (`work` is normally [`HOLDER_WORK`]).
pub fn distlock_run_holder(exe: std::path::PathBuf, work: String) -> HolderCommand {
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

/// Every scenario's name, in report order.
pub const SCENARIOS: &[&str] = &[
    "holder_killed",
    "holder_paused",
    "client_partitioned",
    "server_restarted",
    "latency_injected",
    "release_reply_lost",
    "cancellation_storm",
    "replica_failover",
    "minority_down",
    "majority_down",
];

/// Runs one scenario by name.
pub async fn run_scenario(name: &str, env: &ScenarioEnv) -> ScenarioReport {
    let fut = async {
        match name {
            "holder_killed" => holder_killed(env).await,
            "holder_paused" => holder_paused(env).await,
            "client_partitioned" => client_partitioned(env).await,
            "server_restarted" => server_restarted(env).await,
            "latency_injected" => latency_injected(env).await,
            "release_reply_lost" => release_reply_lost(env).await,
            "cancellation_storm" => cancellation_storm(env).await,
            "replica_failover" => replica_failover(env).await,
            "minority_down" => minority_down(env).await,
            "majority_down" => majority_down(env).await,
            other => ScenarioReport::failed(format!("unknown scenario {other:?}")),
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

/// A holder process is killed with SIGKILL: how long until another client
/// gets the key (TTL or session timeout), and it must get it.
pub async fn holder_killed(env: &ScenarioEnv) -> ScenarioReport {
    finish(holder_killed_inner(env).await)
}

async fn holder_killed_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let observer = client(env).await?;
    let runs = if env.quick { 2 } else { 5 };
    let mut samples = Vec::new();
    for run in 0..runs {
        let key = key(&format!("killed-{run}"));
        let Some((holder, _)) = start_holder(env, &*observer, &key, None).await? else {
            return Ok(ScenarioReport::skipped(
                "no holder process or URL for this target",
            ));
        };
        let killed_at = Instant::now();
        holder.kill_group();
        drop(holder);
        let bound = free_bound(env, &*observer);
        let lease = observer
            .acquire(&key, env.ttl, killed_at + bound)
            .await
            .map_err(|e| format!("the killed holder's lock was not freed within {bound:?}: {e}"))?;
        samples.push(killed_at.elapsed());
        let _ = observer.release(&lease).await;
    }
    let mut figures = BTreeMap::new();
    figures.insert(
        "time_to_free_p50_ms".into(),
        ms(percentile(&mut samples, 0.5)),
    );
    figures.insert(
        "time_to_free_p99_ms".into(),
        ms(percentile(&mut samples, 0.99)),
    );
    figures.insert("runs".into(), json!(runs));
    Ok(ScenarioReport::judged(
        false,
        false,
        format!(
            "freed after {:?} (median of {runs})",
            percentile(&mut samples, 0.5)
        ),
        figures,
    ))
}

/// A holder process is paused (SIGSTOP, with the command it runs) past
/// its TTL while another client takes the key and writes to the protected
/// resource. On resume the paused process itself writes to the resource
/// with the token it holds, as a process that does not know it was paused
/// would, and must then learn it lost the lock (exit 76). The resource
/// records every write (token, writer, time) and the history checker judges
/// them from the grant order: a write of the older grant that a
/// token-checking resource would let in after the newer holder's write is
/// a stale write accepted. Without fencing tokens this is a negative
/// control: the stale write must be observed getting in.
pub async fn holder_paused(env: &ScenarioEnv) -> ScenarioReport {
    finish(holder_paused_inner(env).await)
}

async fn holder_paused_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let other = client(env).await?;
    let caps = other.capabilities();
    let fenced = caps.has_fencing();
    let key = key("paused");
    // One clock for everything, from before the holder starts.
    let history = Arc::new(History::new());
    let resource = ResourceServer::start()
        .await
        .map_err(|e| format!("resource server: {e}"))?;
    let Some((mut holder, token_a)) = start_holder(env, &*other, &key, Some(&resource)).await?
    else {
        return Ok(ScenarioReport::skipped(
            "no holder process or URL for this target",
        ));
    };
    let seen_at = Instant::now();
    // Wait for the holder's first write, so the pause lands mid-work.
    let until = Instant::now() + Duration::from_secs(5);
    while resource.arrivals().is_empty() {
        if Instant::now() >= until {
            return Err("the holder process never wrote to the resource".into());
        }
        sleep(Duration::from_millis(10)).await;
    }
    let groups = holder.child_groups();
    holder.signal(libc::SIGSTOP);
    holder.signal_children(&groups, libc::SIGSTOP);
    let paused_at = Instant::now();
    let rec_a = history.process();
    let rec_b = history.process();
    // The holder's grant as observed: held from when it was first seen (or
    // first wrote) until it was paused; what it did after is judged.
    let first_write = resource.arrivals().first().map_or(seen_at, |a| a.at);
    let token_of = |t: Option<FencingToken>| t.filter(|_| fenced);
    rec_a.record_at(
        first_write.min(seen_at),
        EventKind::Ok,
        Op::Acquire,
        &key,
        token_of(token_a),
        Some(paused_at),
    );
    let bound = free_bound(env, &*other);
    let lease_b = recorded_acquire(&*other, &rec_b, &key, env.ttl, paused_at + bound)
        .await
        .map_err(|e| format!("the paused holder's lock was not freed within {bound:?}: {e}"))?;
    rec_b.wrote(&key, token_of(Some(lease_b.token())));
    // Resume the command first: it acts on what it believes before the
    // lock keeper can tell it anything.
    let resumed_at = Instant::now();
    holder.signal_children(&groups, libc::SIGCONT);
    let until = Instant::now() + Duration::from_secs(3);
    while !resource.arrivals().iter().any(|a| a.at >= resumed_at) && Instant::now() < until {
        sleep(Duration::from_millis(5)).await;
    }
    holder.signal(libc::SIGCONT);
    let mut exit_code = None;
    let mut noticed_after = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = holder.child.try_wait() {
            exit_code = status.code();
            noticed_after = Some(resumed_at.elapsed());
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    let _ = recorded_release(&*other, &rec_b, &lease_b).await;
    let arrivals = resource.arrivals();
    let late_writes = arrivals.iter().filter(|a| a.at >= resumed_at).count();
    for arrival in &arrivals {
        let token = arrival.line.parse::<u64>().ok().map(FencingToken::new);
        rec_a.record_at(
            arrival.at,
            EventKind::Ok,
            Op::Write,
            &key,
            token_of(token),
            None,
        );
    }
    if late_writes == 0 {
        return Err(
            "the resumed holder made no write: nothing was observed to judge (the instrument failed)"
                .into(),
        );
    }
    let report = history.check();
    // A stale write getting in, or the current holder's write refused (its
    // token was not above the paused holder's): either way the tokens did
    // not protect the resource.
    let stale_accepted =
        report.stale_writes_accepted > 0 || report.current_holder_writes_rejected > 0;
    let mut figures = BTreeMap::new();
    figures.insert("paused_for_ms".into(), ms(resumed_at - paused_at));
    if let Some(d) = noticed_after {
        figures.insert("lost_signal_after_resume_ms".into(), ms(d));
    }
    figures.insert("holder_exit_code".into(), json!(exit_code));
    figures.insert("writes_after_resume".into(), json!(late_writes));
    figures.insert(
        "stale_writes_accepted".into(),
        json!(report.stale_writes_accepted),
    );
    figures.insert("writes_rejected".into(), json!(report.writes_rejected));
    figures.insert(
        "current_holder_writes_rejected".into(),
        json!(report.current_holder_writes_rejected),
    );
    let noticed = exit_code == Some(76);
    let violated = stale_accepted || !noticed;
    Ok(ScenarioReport::judged(
        !fenced,
        violated,
        format!(
            "resumed holder {} its loss ({}); of its {late_writes} write(s) after resuming, {} got in past the newer holder's write ({})",
            if noticed {
                "reported"
            } else {
                "did NOT report"
            },
            exit_code.map_or("still running".to_owned(), |c| format!("exit {c}")),
            report.stale_writes_accepted,
            report.summary()
        ),
        figures,
    ))
}

/// A client is cut off (through a fault proxy) while it holds the lock:
/// its lost signal must fire before the server lets another client in.
pub async fn client_partitioned(env: &ScenarioEnv) -> ScenarioReport {
    finish(client_partitioned_inner(env).await)
}

async fn client_partitioned_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some((cut_client, proxy)) = proxied_client(env).await? else {
        return Ok(ScenarioReport::skipped(NO_PROXY));
    };
    let other = client(env).await?;
    let key = key("partitioned");
    let guard = LockClient::from_arc(cut_client)
        .lock(key.as_str())
        .ttl(env.ttl)
        .acquire()
        .await
        .map_err(|e| format!("acquire through the proxy: {e}"))?;
    sleep(env.ttl / 2).await;
    proxy.partition();
    let cut_at = Instant::now();
    let bound = free_bound(env, &*other);
    let (lost_at, granted) = tokio::join!(
        async {
            guard.lost().await;
            Instant::now()
        },
        async {
            let r = other.acquire(&key, env.ttl, cut_at + bound).await;
            (r, Instant::now())
        }
    );
    let (grant, granted_at) = granted;
    proxy.heal();
    let lease = grant.map_err(|e| format!("the partitioned holder's lock was never freed: {e}"))?;
    let _ = other.release(&lease).await;
    let mut figures = BTreeMap::new();
    figures.insert("lost_signal_latency_ms".into(), ms(lost_at - cut_at));
    figures.insert("time_to_free_ms".into(), ms(granted_at - cut_at));
    let violated = lost_at > granted_at;
    // Positive: the holder knew before anyone else was let in.
    let margin_ms = if violated {
        -((lost_at - granted_at).as_secs_f64() * 1e3)
    } else {
        (granted_at - lost_at).as_secs_f64() * 1e3
    };
    figures.insert("lost_before_grant_ms".into(), json!(margin_ms));
    Ok(ScenarioReport::judged(
        false,
        violated,
        if violated {
            format!(
                "another client was granted {:?} BEFORE the cut-off holder was told",
                lost_at - granted_at
            )
        } else {
            format!(
                "lost signal {:?} before another client was granted",
                granted_at - lost_at
            )
        },
        figures,
    ))
}

/// The server is killed and restarted while a lock is held. Stores that
/// keep their data must not grant the key again before the holder's
/// deadline, and tokens must not go backwards; where tokens do not survive
/// a failover (Redis without persistence) this is a negative control.
pub async fn server_restarted(env: &ScenarioEnv) -> ScenarioReport {
    match server_restarted_inner(env).await {
        Ok(r) => r,
        Err(e) => {
            let _ = env.target.heal().await;
            ScenarioReport::failed(e)
        }
    }
}

async fn server_restarted_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let a = client(env).await?;
    let caps = a.capabilities();
    let key = key("restarted");
    let history = Arc::new(History::new());
    let rec_a = history.process();
    let rec_b = history.process();
    rec_a.invoke(Op::Acquire, &key, None);
    let lease_a = a
        .acquire(
            &key,
            env.ttl.max(Duration::from_secs(5)),
            Instant::now() + Duration::from_secs(10),
        )
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    rec_a.acquired(&key, lease_a.token(), lease_a.validity_deadline());
    if !env
        .target
        .kill_and_restart_server()
        .await
        .map_err(|e| format!("restart: {e}"))?
    {
        let _ = a.release(&lease_a).await;
        return Ok(ScenarioReport::skipped("target cannot restart its server"));
    }
    let restarted_at = Instant::now();
    // A fresh client right after the restart: may it take the held key?
    let b = {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match env.target.client().await {
                Ok(b) => break b,
                Err(e) if Instant::now() >= until => {
                    return Err(format!("client after restart: {e}"));
                }
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
    };
    let mut early = None;
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        match b.try_acquire(&key, env.ttl).await {
            Ok(Some(lease)) => {
                rec_b.acquired(&key, lease.token(), lease.validity_deadline());
                early = Some(lease);
                break;
            }
            Ok(None) => break,
            Err(_) => sleep(Duration::from_millis(100)).await,
        }
    }
    if let Some(lease) = &early {
        rec_b.invoke(Op::Release, &key, Some(lease.token()));
        let _ = b.release(lease).await;
    }
    rec_a.invoke(Op::Release, &key, Some(lease_a.token()));
    let released = a.release(&lease_a).await.unwrap_or(false);
    rec_b.invoke(Op::Acquire, &key, None);
    // If the holder's release did not reach the restarted server, its
    // lease (held for at least 5 s) runs out first.
    let after = b
        .acquire(
            &key,
            env.ttl,
            Instant::now().max(lease_a.validity_deadline()) + free_bound(env, &*b),
        )
        .await
        .map_err(|e| format!("acquire after the restart: {e}"))?;
    rec_b.acquired(&key, after.token(), after.validity_deadline());
    rec_b.invoke(Op::Release, &key, Some(after.token()));
    let _ = b.release(&after).await;
    let report = history.check();
    let regressed = report.token_regressions + report.duplicate_tokens > 0;
    let violated = report.overlap_count > 0 || (caps.has_fencing() && regressed);
    let mut figures = BTreeMap::new();
    figures.insert("token_before".into(), json!(lease_a.token().get()));
    figures.insert("token_after".into(), json!(after.token().get()));
    figures.insert("double_grant".into(), json!(report.overlap_count > 0));
    figures.insert(
        "token_regressions".into(),
        json!(report.token_regressions + report.duplicate_tokens),
    );
    figures.insert("holder_release_found_lock".into(), json!(released));
    figures.insert("recovery_ms".into(), ms(restarted_at.elapsed()));
    Ok(ScenarioReport::judged(
        !caps.fencing_survives_failover || !caps.grants_survive_restart,
        violated,
        format!(
            "after restart: {}, token {} -> {}",
            if report.overlap_count > 0 {
                "key granted again while held"
            } else {
                "held key stayed held"
            },
            lease_a.token(),
            after.token()
        ),
        figures,
    ))
}

/// One client holds the key through a guard (renewing on its own) over a
/// link whose latency rises step by step past the TTL (one-way TTL/8,
/// TTL/4, then 2 x TTL), while a second
/// client, directly connected, keeps probing for the key and takes it
/// whenever the server frees it. Every acquire, renewal, release and lost
/// signal goes into one history: the holder's promised window ends at its
/// lost signal or its last renewal's deadline, and must never overlap the
/// prober's grants; no grant may be handed out with its deadline already
/// passed (the slow client also tries fresh acquires at the highest
/// latency). A client that computes its deadline from the reply instead of
/// the request overlaps here.
pub async fn latency_injected(env: &ScenarioEnv) -> ScenarioReport {
    finish(latency_injected_inner(env).await)
}

async fn latency_injected_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some((slow, proxy)) = proxied_client(env).await? else {
        return Ok(ScenarioReport::skipped(NO_PROXY));
    };
    let fast = client(env).await?;
    let ttl = env.ttl;
    let key = key("latency");
    let history = Arc::new(History::new());
    let rec_slow = history.process();
    let rec_probe = history.process();
    let rec_probe_id = rec_probe.id();
    proxy.set_latency(ttl / 20, Duration::ZERO);
    let guard = recorded_guard(slow.clone(), &rec_slow, &key, ttl, Duration::from_secs(10))
        .await
        .map_err(|e| format!("acquire through the proxy: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let probe: Arc<dyn LockBackend> = Arc::new(RecordingBackend::new(fast, rec_probe));
    let prober = {
        let (probe, key, stop) = (probe.clone(), key.clone(), stop.clone());
        tokio::spawn(async move {
            let mut grants = 0usize;
            let mut first_grant = None;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Some(lease)) = probe.try_acquire(&key, ttl).await {
                    grants += 1;
                    first_grant.get_or_insert_with(Instant::now);
                    sleep(ttl / 10).await;
                    let _ = timeout(Duration::from_secs(10), probe.release(&lease)).await;
                }
                sleep(Duration::from_millis(5)).await;
            }
            (grants, first_grant)
        })
    };
    let started = Instant::now();
    // One-way latency ttl/8, then ttl/4 (renewals still get through, each
    // reply a quarter of the TTL after the server extended the lease), then
    // twice the TTL: no renewal can arrive in time any more, the server
    // frees the key, and the holder must have stopped promising first.
    for step in [8u32, 4] {
        proxy.set_latency(ttl / step, ttl / (step * 10));
        sleep(ttl * 3 / 2).await;
    }
    proxy.set_latency(ttl * 2, ttl / 20);
    // Stay at the highest latency until the prober got the key (the server
    // must free it once renewals cannot arrive in time) or the bound ran out.
    let until = Instant::now() + free_bound(env, &*slow);
    let probed = || probe_grants_so_far(&history, rec_probe_id);
    while probed() == 0 && Instant::now() < until {
        sleep(Duration::from_millis(20)).await;
    }
    let lost_at = guard.state().is_terminal().then(|| started.elapsed());
    // Fresh acquires at the highest latency: each either fails or comes
    // back with time left on it.
    let mut slow_grants = 0usize;
    let mut slow_errors = 0usize;
    for _ in 0..2 {
        let rec = history.process();
        let recorded: Arc<dyn LockBackend> = Arc::new(RecordingBackend::new(slow.clone(), rec));
        match recorded.acquire(&key, ttl, Instant::now() + ttl * 2).await {
            Ok(lease) => {
                slow_grants += 1;
                let _ = timeout(Duration::from_secs(10), recorded.release(&lease)).await;
            }
            Err(_) => slow_errors += 1,
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (probe_grants, first_probe_grant) = prober.await.map_err(|e| e.to_string())?;
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    let _ = timeout(Duration::from_secs(10), guard.release()).await;
    let report = history.check();
    let violated = !report.is_exclusive();
    let mut figures = BTreeMap::new();
    figures.insert("probe_grants".into(), json!(probe_grants));
    figures.insert("slow_grants".into(), json!(slow_grants));
    figures.insert("slow_errors".into(), json!(slow_errors));
    figures.insert(
        "grants_past_deadline".into(),
        json!(report.grants_past_deadline),
    );
    figures.insert("overlapping_windows".into(), json!(report.overlap_count));
    if let Some(at) = first_probe_grant {
        figures.insert("key_freed_after_ms".into(), ms(at - started));
    }
    if let Some(at) = lost_at {
        figures.insert("holder_lost_by_ms".into(), ms(at));
    }
    if probe_grants == 0 && !violated {
        return Err(format!(
            "the prober never got the key while latency rose past the TTL (holder {}): nothing was observed to judge",
            guard_state_text(lost_at)
        ));
    }
    Ok(ScenarioReport::judged(
        false,
        violated,
        format!(
            "holder renewed through rising latency, prober took the key {probe_grants} time(s); {}",
            report.summary()
        ),
        figures,
    ))
}

/// Grants the process `process` has had so far.
fn probe_grants_so_far(history: &History, process: u64) -> usize {
    history
        .events()
        .iter()
        .filter(|e| e.process == process && e.op == Op::Acquire && e.kind == EventKind::Ok)
        .count()
}

fn guard_state_text(lost_at: Option<Duration>) -> String {
    lost_at.map_or_else(|| "still held".to_owned(), |at| format!("ended by {at:?}"))
}

/// A release whose reply is lost (the client is partitioned while
/// releasing, the request delivered later) and retried must never delete
/// the next holder's lock.
pub async fn release_reply_lost(env: &ScenarioEnv) -> ScenarioReport {
    finish(release_reply_lost_inner(env).await)
}

async fn release_reply_lost_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some((a, proxy)) = proxied_client(env).await? else {
        return Ok(ScenarioReport::skipped(NO_PROXY));
    };
    let b = client(env).await?;
    let key = key("release-lost");
    let lease_a = a
        .acquire(&key, env.ttl, Instant::now() + Duration::from_secs(10))
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    proxy.partition();
    let first = timeout(Duration::from_secs(30), a.release(&lease_a)).await;
    // B gets the key once A's lease runs out.
    let lease_b = b
        .acquire(
            &key,
            env.ttl.max(Duration::from_secs(5)),
            Instant::now() + free_bound(env, &*b),
        )
        .await
        .map_err(|e| format!("the next holder never got the key: {e}"))?;
    // The held release is delivered now, then retried.
    proxy.heal();
    sleep(Duration::from_millis(200)).await;
    let retried = timeout(Duration::from_secs(30), a.release(&lease_a)).await;
    let info = b.inspect(&key).await.map_err(|e| format!("inspect: {e}"))?;
    let still_b = info
        .as_ref()
        .is_some_and(|i| i.token.is_none_or(|t| t == lease_b.token()));
    let _ = b.release(&lease_b).await;
    let mut figures = BTreeMap::new();
    figures.insert(
        "first_release".into(),
        json!(format!("{first:?}").chars().take(80).collect::<String>()),
    );
    figures.insert(
        "retried_release_said_held".into(),
        json!(matches!(retried, Ok(Ok(true)))),
    );
    figures.insert("next_holder_kept_lock".into(), json!(still_b));
    let violated = !still_b || matches!(retried, Ok(Ok(true)));
    Ok(ScenarioReport::judged(
        false,
        violated,
        if violated {
            "the late/retried release removed the next holder's lock".to_owned()
        } else {
            "late and retried releases left the next holder's lock alone".to_owned()
        },
        figures,
    ))
}

/// Thousands of acquires are cancelled (waiting on a held key, and at
/// random points on free keys): afterwards every key is free within its TTL.
pub async fn cancellation_storm(env: &ScenarioEnv) -> ScenarioReport {
    finish(cancellation_storm_inner(env).await)
}

async fn cancellation_storm_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let holder = client(env).await?;
    let stormer = client(env).await?;
    let total: usize = if env.quick { 1_000 } else { 10_000 };
    let held = key("storm-held");
    let free: Vec<LockKey> = (0..8).map(|i| key(&format!("storm-free-{i}"))).collect();
    let lease = holder
        .acquire(
            &held,
            env.ttl.max(Duration::from_secs(5)),
            Instant::now() + Duration::from_secs(10),
        )
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    let started = Instant::now();
    let batch = 100;
    let mut done = 0;
    while done < total {
        let mut tasks = Vec::with_capacity(batch);
        for i in 0..batch.min(total - done) {
            let (stormer, key) = (
                stormer.clone(),
                if i % 2 == 0 {
                    held.clone()
                } else {
                    free[i % free.len()].clone()
                },
            );
            let ttl = env.ttl;
            let cut = Duration::from_micros(u64::try_from((done + i) % 40).unwrap_or(0) * 250);
            tasks.push(tokio::spawn(async move {
                let _ = timeout(
                    cut,
                    stormer.acquire(&key, ttl, Instant::now() + Duration::from_secs(5)),
                )
                .await;
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        done += batch;
    }
    let storm_time = started.elapsed();
    let _ = holder.release(&lease).await;
    let checker = client(env).await?;
    let bound = free_bound(env, &*checker);
    let check_start = Instant::now();
    let mut leftovers = 0;
    for key in std::iter::once(&held).chain(free.iter()) {
        match checker.acquire(key, env.ttl, check_start + bound).await {
            Ok(l) => {
                let _ = checker.release(&l).await;
            }
            Err(_) => leftovers += 1,
        }
    }
    let mut figures = BTreeMap::new();
    figures.insert("cancelled_acquires".into(), json!(total));
    figures.insert("storm_ms".into(), ms(storm_time));
    figures.insert("leftovers".into(), json!(leftovers));
    figures.insert("all_free_after_ms".into(), ms(check_start.elapsed()));
    Ok(ScenarioReport::judged(
        false,
        leftovers > 0,
        format!("{total} cancelled acquires; {leftovers} key(s) still held after {bound:?}"),
        figures,
    ))
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
    rec.invoke(Op::Release, lease.key(), Some(lease.token()));
    match timeout(Duration::from_secs(10), backend.release(lease)).await {
        Ok(Ok(held)) => {
            rec.released(lease.key(), lease.token(), held);
            held
        }
        _ => {
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

/// A client holds the lock on the primary, the primary is killed and
/// another node takes over (a promoted replica, a newly elected leader),
/// and a new client asks for the same key. Where the failover can lose
/// acknowledged writes (asynchronous replication: the target holds
/// replication back before the grant so that the loss is certain), the
/// history checker must report the double grant and the token going
/// backwards: a negative control for backends whose capabilities do not
/// promise `fencing_survives_failover` and `linearizable`. Elsewhere the
/// key must stay held and tokens must keep growing.
pub async fn replica_failover(env: &ScenarioEnv) -> ScenarioReport {
    match replica_failover_inner(env).await {
        Ok(r) => r,
        Err(e) => {
            let _ = restart_all(env).await;
            ScenarioReport::failed(e)
        }
    }
}

async fn replica_failover_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let a = client(env).await?;
    let caps = a.capabilities();
    let negative_control = !caps.fencing_survives_failover || !caps.linearizable;
    let key = key("failover");
    let history = Arc::new(History::new());
    let rec_a = history.process();
    let rec_b = history.process();
    let wait = Instant::now() + Duration::from_secs(10);
    // Grants the replicas (or followers) certainly have.
    for _ in 0..3 {
        let lease = recorded_acquire(&*a, &rec_a, &key, env.ttl, wait)
            .await
            .map_err(|e| format!("acquire before the failover: {e}"))?;
        recorded_release(&*a, &rec_a, &lease).await;
    }
    let held_back = env
        .target
        .hold_replication()
        .await
        .map_err(|e| format!("holding replication back: {e}"))?;
    if held_back {
        // Grants the replica never hears of: tokens move on the primary only.
        for _ in 0..3 {
            let lease = recorded_acquire(&*a, &rec_a, &key, env.ttl, wait)
                .await
                .map_err(|e| format!("acquire with replication held: {e}"))?;
            recorded_release(&*a, &rec_a, &lease).await;
        }
    }
    // The holder keeps the key well past the failover.
    let hold_ttl = env.ttl.max(Duration::from_secs(10));
    let held = recorded_acquire(&*a, &rec_a, &key, hold_ttl, wait)
        .await
        .map_err(|e| format!("acquire before the failover: {e}"))?;
    let started = Instant::now();
    let failed_over = match timeout(Duration::from_secs(60), env.target.fail_over()).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return Err(format!("failover: {e}")),
        Err(_) => return Err("failover took over 60 s".into()),
    };
    if !failed_over {
        let _ = a.release(&held).await;
        return Ok(ScenarioReport::skipped(
            "target cannot fail over (no replica or cluster)",
        ));
    }
    let failover_time = started.elapsed();
    // A new client, as a process started after the failover would be.
    let b = client_within(env, Duration::from_secs(30)).await?;
    let mut second = None;
    let mut refused = false;
    let mut errors = 0usize;
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        rec_b.invoke(Op::Acquire, &key, None);
        match timeout(Duration::from_secs(5), b.try_acquire(&key, env.ttl)).await {
            Ok(Ok(Some(lease))) => {
                rec_b.acquired(&key, lease.token(), lease.validity_deadline());
                second = Some(lease);
                break;
            }
            Ok(Ok(None)) => {
                rec_b.failed(Op::Acquire, &key, None);
                refused = true;
                break;
            }
            _ => {
                rec_b.failed(Op::Acquire, &key, None);
                errors += 1;
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let answered_after = started.elapsed();
    if let Some(lease) = &second {
        recorded_release(&*b, &rec_b, lease).await;
    }
    // The old holder lets go (its client may still point at the dead node).
    let holder_release_found_lock = recorded_release(&*a, &rec_a, &held).await;
    // The backend still works after the failover, and its tokens go on
    // (temporary errors are retried: a client may still try a dead node).
    let until = Instant::now() + free_bound(env, &*b);
    let after = loop {
        let deadline = until.min(Instant::now() + Duration::from_secs(5));
        match recorded_acquire(&*b, &rec_b, &key, env.ttl, deadline).await {
            Ok(lease) => break lease,
            Err(e) if e.is_temporary() && Instant::now() < until => {
                errors += 1;
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("acquire after the failover: {e}")),
        }
    };
    recorded_release(&*b, &rec_b, &after).await;
    let restart = restart_all(env).await?;
    let report = history.check();
    let regressions = report.token_regressions + report.duplicate_tokens;
    let double_grant = report.overlap_count > 0;
    let violated = double_grant || (caps.has_fencing() && regressions > 0);
    let mut figures = BTreeMap::new();
    figures.insert("replication_held".into(), json!(held_back));
    figures.insert("failover_ms".into(), ms(failover_time));
    figures.insert("answered_after_ms".into(), ms(answered_after));
    figures.insert("double_grant".into(), json!(double_grant));
    figures.insert("overlapping_windows".into(), json!(report.overlap_count));
    figures.insert(
        "max_concurrent_holders".into(),
        json!(report.max_concurrent_holders),
    );
    figures.insert("token_regressions".into(), json!(regressions));
    figures.insert("token_held".into(), json!(held.token().get()));
    figures.insert(
        "token_granted_after_failover".into(),
        json!(second.as_ref().map(|l| l.token().get())),
    );
    figures.insert("token_after".into(), json!(after.token().get()));
    figures.insert("errors_after_failover".into(), json!(errors));
    figures.insert(
        "holder_release_found_lock".into(),
        json!(holder_release_found_lock),
    );
    figures.insert("restart_ms".into(), ms(restart));
    let what = match (&second, refused) {
        (Some(l), _) => format!(
            "the key held with token {} was granted AGAIN after the failover (token {})",
            held.token(),
            l.token()
        ),
        (None, true) => format!("the key held with token {} stayed held", held.token()),
        (None, false) => "the new client got no answer within 15 s".to_owned(),
    };
    if second.is_none() && !refused && !negative_control {
        return Ok(ScenarioReport::judged(
            false,
            true,
            format!("{what}: the backend did not recover from the failover"),
            figures,
        ));
    }
    Ok(ScenarioReport::judged(
        negative_control,
        violated,
        format!(
            "{}failover in {failover_time:?}: {what}; checker: {}",
            if held_back {
                "replication held back, "
            } else {
                ""
            },
            report.summary()
        ),
        figures,
    ))
}

/// What a contention run saw.
#[derive(Default)]
struct ContentionFigures {
    grants_before: usize,
    grants_after: usize,
    acquire_errors: usize,
    first_grant_after: Option<Duration>,
    max_gap_after: Duration,
}

/// A minority of the cluster's nodes is killed (the leader first) during
/// a contention run: grants must continue, windows must not overlap, and
/// tokens must keep growing where the backend has fencing.
pub async fn minority_down(env: &ScenarioEnv) -> ScenarioReport {
    match minority_down_inner(env).await {
        Ok(r) => r,
        Err(e) => {
            let _ = restart_all(env).await;
            ScenarioReport::failed(e)
        }
    }
}

async fn minority_down_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some(size) = env.target.cluster_size() else {
        return Ok(ScenarioReport::skipped("target is not a quorum cluster"));
    };
    let n = size.saturating_sub(1) / 2;
    if n == 0 {
        return Ok(ScenarioReport::skipped(
            "a cluster this small has no minority to lose",
        ));
    }
    let clients = [client(env).await?, client(env).await?];
    let caps = clients[0].capabilities();
    let key = key("minority");
    let history = Arc::new(History::new());
    let resource = Arc::new(FencedResource::new());
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let errors = Arc::new(AtomicUsize::new(0));
    let tasks_n = 4;
    let mut tasks = Vec::new();
    for t in 0..tasks_n {
        let backend = clients[t % clients.len()].clone();
        let rec = history.process();
        let (key, resource, stop, grants, errors) = (
            key.clone(),
            resource.clone(),
            stop.clone(),
            grants.clone(),
            errors.clone(),
        );
        let (ttl, fencing) = (env.ttl, caps.has_fencing());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let deadline = Instant::now() + Duration::from_secs(3);
                match recorded_acquire(&*backend, &rec, &key, ttl, deadline).await {
                    Ok(lease) => {
                        grants
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(Instant::now());
                        if fencing {
                            resource.write(&rec, &key, lease.token(), |v| *v += 1);
                        }
                        sleep(Duration::from_millis(2)).await;
                        recorded_release(&*backend, &rec, &lease).await;
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::SeqCst);
                        sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    sleep(if env.quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(2)
    })
    .await;
    let errors_before = errors.load(Ordering::SeqCst);
    let killed_at = Instant::now();
    let stopped = timeout(Duration::from_secs(30), env.target.stop_nodes(n)).await;
    let total = match stopped {
        Ok(Ok(Some(total))) => total,
        other => {
            stop.store(true, Ordering::SeqCst);
            for t in tasks {
                let _ = t.await;
            }
            return match other {
                Ok(Ok(None)) => Ok(ScenarioReport::skipped("target cannot stop nodes")),
                Ok(Err(e)) => Err(format!("stopping {n} nodes: {e}")),
                _ => Err(format!("stopping {n} nodes took over 30 s")),
            };
        }
    };
    // Run on until enough grants came after the kill (an election may
    // take seconds), within a bound.
    let (min_run, want, cap) = if env.quick {
        (Duration::from_secs(2), 20, Duration::from_secs(20))
    } else {
        (Duration::from_secs(6), 100, Duration::from_secs(40))
    };
    loop {
        sleep(Duration::from_millis(100)).await;
        let after = grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|g| **g > killed_at)
            .count();
        let ran = killed_at.elapsed();
        if (ran >= min_run && after >= want) || ran >= cap {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = timeout(Duration::from_secs(30), t).await;
    }
    let ran_for = killed_at.elapsed();
    let restart = restart_all(env).await?;
    let mut fig = ContentionFigures::default();
    {
        let mut times = grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        times.sort_unstable();
        let mut last = killed_at;
        for g in times {
            if g <= killed_at {
                fig.grants_before += 1;
                continue;
            }
            fig.grants_after += 1;
            fig.first_grant_after.get_or_insert(g - killed_at);
            fig.max_gap_after = fig.max_gap_after.max(g - last);
            last = g;
        }
    }
    fig.acquire_errors = errors.load(Ordering::SeqCst);
    let report = history.check();
    let regressions = report.token_regressions + report.duplicate_tokens;
    let unsafe_ = !report.is_exclusive() || (caps.has_fencing() && regressions > 0);
    let stalled = fig.grants_after == 0;
    let mut figures = BTreeMap::new();
    figures.insert("nodes_stopped".into(), json!(n));
    figures.insert("nodes_total".into(), json!(total));
    figures.insert("grants_before".into(), json!(fig.grants_before));
    figures.insert("grants_after".into(), json!(fig.grants_after));
    figures.insert(
        "acquire_errors_after".into(),
        json!(fig.acquire_errors.saturating_sub(errors_before)),
    );
    figures.insert(
        "first_grant_after_ms".into(),
        fig.first_grant_after.map_or(Value::Null, ms),
    );
    figures.insert("max_gap_after_ms".into(), ms(fig.max_gap_after));
    figures.insert("ran_after_kill_ms".into(), ms(ran_for));
    figures.insert("overlapping_windows".into(), json!(report.overlap_count));
    figures.insert(
        "max_concurrent_holders".into(),
        json!(report.max_concurrent_holders),
    );
    figures.insert("fencing".into(), json!(caps.has_fencing()));
    // Without fencing, tokens are not promised to grow: not judged.
    figures.insert(
        "token_regressions".into(),
        if caps.has_fencing() {
            json!(regressions)
        } else {
            Value::Null
        },
    );
    figures.insert(
        "stale_writes_accepted".into(),
        json!(report.stale_writes_accepted),
    );
    figures.insert("restart_ms".into(), ms(restart));
    Ok(ScenarioReport::judged(
        false,
        unsafe_ || stalled,
        format!(
            "{n} of {total} nodes killed: {} grants before, {} after (first {}); {}",
            fig.grants_before,
            fig.grants_after,
            fig.first_grant_after
                .map_or("never".to_owned(), |d| format!("after {d:?}")),
            report.summary()
        ),
        figures,
    ))
}

/// A majority of the cluster's nodes is killed: an acquire (waiting 1 s)
/// must fail with a typed error within its wait deadline plus 1.5 s, and
/// once the nodes are back the key must be free within the TTL plus a
/// margin (the session bound for per-session backends): the failed
/// attempt left nothing behind.
///
/// Caveat: with Redlock, a partial grant left on the surviving minority
/// would be outvoted by the restarted (empty) nodes, so this check cannot
/// see it; it still expires with its TTL. lock-redis's own tests inspect
/// the surviving nodes directly.
pub async fn majority_down(env: &ScenarioEnv) -> ScenarioReport {
    match majority_down_inner(env).await {
        Ok(r) => r,
        Err(e) => {
            let _ = restart_all(env).await;
            ScenarioReport::failed(e)
        }
    }
}

async fn majority_down_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some(size) = env.target.cluster_size() else {
        return Ok(ScenarioReport::skipped("target is not a quorum cluster"));
    };
    let n = size / 2 + 1;
    // Connected before the kill: some clients refuse to start without a
    // majority.
    let a = client(env).await?;
    let key = key("majority");
    let warm = a
        .acquire(&key, env.ttl, Instant::now() + Duration::from_secs(10))
        .await
        .map_err(|e| format!("acquire before the kill: {e}"))?;
    let _ = a.release(&warm).await;
    let total = match timeout(Duration::from_secs(30), env.target.stop_nodes(n)).await {
        Ok(Ok(Some(total))) => total,
        Ok(Ok(None)) => return Ok(ScenarioReport::skipped("target cannot stop nodes")),
        Ok(Err(e)) => return Err(format!("stopping {n} nodes: {e}")),
        Err(_) => return Err(format!("stopping {n} nodes took over 30 s")),
    };
    // The margin lets a backend finish one request bounded by its own
    // operation timeout (2 s in the etcd driver); how far past the wait
    // it returned is reported as `overshoot_ms`.
    let wait = Duration::from_secs(1);
    let margin = Duration::from_millis(1500);
    let started = Instant::now();
    let attempt = timeout(
        wait + Duration::from_secs(30),
        a.acquire(&key, env.ttl, started + wait),
    )
    .await;
    let gave_up_after = started.elapsed();
    let (granted, error) = match &attempt {
        Ok(Ok(lease)) => (Some(lease.token()), None),
        Ok(Err(e)) => (None, Some(format!("{:?}", e.kind()))),
        Err(_) => (None, None),
    };
    let typed_in_time = matches!(&attempt, Ok(Err(_))) && gave_up_after <= wait + margin;
    let restart = restart_all(env).await?;
    if let Ok(Ok(lease)) = &attempt {
        let _ = timeout(Duration::from_secs(10), a.release(lease)).await;
    }
    // Back to full strength: the key must be free (nothing half-granted
    // left), within the TTL plus a margin.
    let restarted_at = Instant::now();
    let b = client_within(env, Duration::from_secs(30)).await?;
    let bound = match b.capabilities().ttl_model {
        TtlModel::PerLease => env.ttl + Duration::from_secs(2),
        _ => free_bound(env, &*b),
    };
    let mut free_after = None;
    let mut last_error = String::new();
    while restarted_at.elapsed() < bound + Duration::from_secs(5) {
        match b.acquire(&key, env.ttl, restarted_at + bound).await {
            Ok(lease) => {
                free_after = Some(restarted_at.elapsed());
                let _ = b.release(&lease).await;
                break;
            }
            Err(e) if e.is_contended() => {
                last_error = e.to_string();
                break;
            }
            Err(e) => {
                last_error = e.to_string();
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let mut figures = BTreeMap::new();
    figures.insert("nodes_stopped".into(), json!(n));
    figures.insert("nodes_total".into(), json!(total));
    figures.insert("wait_ms".into(), ms(wait));
    figures.insert("gave_up_after_ms".into(), ms(gave_up_after));
    figures.insert(
        "overshoot_ms".into(),
        ms(gave_up_after.saturating_sub(wait)),
    );
    figures.insert("error_kind".into(), json!(error));
    figures.insert("granted_without_majority".into(), json!(granted.is_some()));
    figures.insert("restart_ms".into(), ms(restart));
    figures.insert(
        "free_after_restart_ms".into(),
        free_after.map_or(Value::Null, ms),
    );
    let violated = !typed_in_time || free_after.is_none();
    let what = match (&attempt, granted) {
        (_, Some(token)) => format!("acquire was GRANTED (token {token}) without a majority"),
        (Ok(Err(e)), None) => format!("acquire failed after {gave_up_after:?} ({e})"),
        _ => format!(
            "acquire did not return within {:?}",
            wait + Duration::from_secs(30)
        ),
    };
    Ok(ScenarioReport::judged(
        false,
        violated,
        format!(
            "{n} of {total} nodes killed: {what}{}; after restarting them the key was {}",
            if typed_in_time || granted.is_some() {
                String::new()
            } else {
                format!(" (allowed: {:?})", wait + margin)
            },
            match free_after {
                Some(d) => format!("free after {d:?}"),
                None => format!("NOT free within {bound:?}: {last_error}"),
            }
        ),
        figures,
    ))
}
