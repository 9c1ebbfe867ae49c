//! Fault scenarios: what each backend does when holders crash or pause,
//! clients are partitioned, servers restart, the network slows down,
//! replies are lost, and acquires are cancelled by the thousand. Each is
//! judged from what clients observed (and, where it applies, the history
//! checker), and reports figures for the comparison.
//!
//! Scenarios where a backend *cannot* be safe are kept as negative
//! controls: there the violation must be seen and is reported as
//! `flagged`; a negative control that shows nothing is a failure of the
//! instrument.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{FencingScope, FencingToken, LockBackend, LockClient, LockKey, OwnerId, TtlModel};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, timeout};

use crate::harness::Target;
use crate::history::{FencedResource, History, Op};

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
/// --on-lost term KEY -- sleep 600` does).
pub type HolderCommand = Arc<dyn Fn(&str, &str, Duration) -> Command + Send + Sync>;

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
            other => ScenarioReport::failed(format!("unknown scenario {other:?}")),
        }
    };
    match timeout(Duration::from_secs(180), fut).await {
        Ok(report) => report,
        Err(_) => {
            let _ = env.target.heal().await;
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

/// Starts a holder process and waits until `inspect` shows the key held.
async fn start_holder(
    env: &ScenarioEnv,
    observer: &dyn LockBackend,
    key: &LockKey,
) -> Result<Option<(Holder, Option<FencingToken>)>, String> {
    let (Some(make), Some(url)) = (&env.holder, env.target.url()) else {
        return Ok(None);
    };
    let mut cmd = make(&url, key.as_str(), env.ttl);
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
    match holder_killed_inner(env).await {
        Ok(r) => r,
        Err(e) => ScenarioReport::failed(e),
    }
}

async fn holder_killed_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let observer = client(env).await?;
    let runs = if env.quick { 2 } else { 5 };
    let mut samples = Vec::new();
    for run in 0..runs {
        let key = key(&format!("killed-{run}"));
        let Some((holder, _)) = start_holder(env, &*observer, &key).await? else {
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

/// A holder process is paused (SIGSTOP) past its TTL while another client
/// takes the key and writes; on resume the old holder must learn it lost
/// the lock (exit 76), and its fenced write must be rejected. Without
/// fencing tokens this is a negative control: the stale write goes through.
pub async fn holder_paused(env: &ScenarioEnv) -> ScenarioReport {
    match holder_paused_inner(env).await {
        Ok(r) => r,
        Err(e) => ScenarioReport::failed(e),
    }
}

async fn holder_paused_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let other = client(env).await?;
    let caps = other.capabilities();
    let key = key("paused");
    let Some((mut holder, token_a)) = start_holder(env, &*other, &key).await? else {
        return Ok(ScenarioReport::skipped(
            "no holder process or URL for this target",
        ));
    };
    holder.signal(libc::SIGSTOP);
    let paused_at = Instant::now();
    let bound = free_bound(env, &*other);
    let lease_b = other
        .acquire(&key, env.ttl, paused_at + bound)
        .await
        .map_err(|e| format!("the paused holder's lock was not freed within {bound:?}: {e}"))?;
    let history = Arc::new(History::new());
    let resource = FencedResource::new();
    let rec_b = history.process();
    let rec_a = history.process();
    resource.write(&rec_b, &key, lease_b.token(), |v| *v += 1);
    holder.signal(libc::SIGCONT);
    let resumed_at = Instant::now();
    // The resumed holder acts on what it believes: it writes with its token.
    let stale_accepted = match (caps.fencing, token_a) {
        (FencingScope::None, _) | (_, None) => true,
        (_, Some(token_a)) => resource.write(&rec_a, &key, token_a, |v| *v += 1),
    };
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
    let _ = other.release(&lease_b).await;
    let mut figures = BTreeMap::new();
    figures.insert("paused_for_ms".into(), ms(resumed_at - paused_at));
    if let Some(d) = noticed_after {
        figures.insert("lost_signal_after_resume_ms".into(), ms(d));
    }
    figures.insert("holder_exit_code".into(), json!(exit_code));
    figures.insert("stale_write_accepted".into(), json!(stale_accepted));
    let negative_control = !caps.has_fencing();
    let noticed = exit_code == Some(76);
    let violated = stale_accepted || !noticed;
    Ok(ScenarioReport::judged(
        negative_control,
        violated,
        format!(
            "resumed holder {} its loss ({}), its stale write was {}",
            if noticed {
                "reported"
            } else {
                "did NOT report"
            },
            exit_code.map_or("still running".to_owned(), |c| format!("exit {c}")),
            if stale_accepted {
                "ACCEPTED (no fencing)"
            } else {
                "rejected by the token check"
            }
        ),
        figures,
    ))
}

/// A client is cut off (through a fault proxy) while it holds the lock:
/// its lost signal must fire before the server lets another client in.
pub async fn client_partitioned(env: &ScenarioEnv) -> ScenarioReport {
    match client_partitioned_inner(env).await {
        Ok(r) => r,
        Err(e) => ScenarioReport::failed(e),
    }
}

async fn client_partitioned_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some((cut_client, proxy)) = env
        .target
        .proxied_client()
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(ScenarioReport::skipped(
            "target cannot put a proxy in front of the server",
        ));
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
    let after = b
        .acquire(&key, env.ttl, Instant::now() + free_bound(env, &*b))
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
        !caps.fencing_survives_failover,
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

/// Latency up to twice the TTL is injected between one client and the
/// server while another contends directly: no grant may be handed out with
/// its deadline already passed, and holds must not overlap. Requests that
/// time out may leave a grant behind: it must expire.
pub async fn latency_injected(env: &ScenarioEnv) -> ScenarioReport {
    match latency_injected_inner(env).await {
        Ok(r) => r,
        Err(e) => ScenarioReport::failed(e),
    }
}

async fn latency_injected_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some((slow, proxy)) = env
        .target
        .proxied_client()
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(ScenarioReport::skipped(
            "target cannot put a proxy in front of the server",
        ));
    };
    let fast = client(env).await?;
    let key = key("latency");
    let history = Arc::new(History::new());
    let mut expired_grants = 0usize;
    let mut grants = 0usize;
    let mut errors = 0usize;
    for step in [4u32, 2, 1] {
        // One-way latency ttl/step: round trips of 2/step x TTL.
        proxy.set_latency(env.ttl / step, env.ttl / (step * 10));
        let rec = history.process();
        rec.invoke(Op::Acquire, &key, None);
        match slow
            .acquire(&key, env.ttl, Instant::now() + env.ttl * 4)
            .await
        {
            Ok(lease) => {
                grants += 1;
                if lease.validity_deadline() <= Instant::now() {
                    expired_grants += 1;
                }
                rec.acquired(&key, lease.token(), lease.validity_deadline());
                rec.invoke(Op::Release, &key, Some(lease.token()));
                let _ = slow.release(&lease).await;
            }
            Err(_) => {
                errors += 1;
                rec.failed(Op::Acquire, &key, None);
            }
        }
        // The direct client contends meanwhile.
        let rec = history.process();
        rec.invoke(Op::Acquire, &key, None);
        if let Ok(lease) = fast
            .acquire(&key, env.ttl, Instant::now() + free_bound(env, &*fast))
            .await
        {
            rec.acquired(&key, lease.token(), lease.validity_deadline());
            rec.invoke(Op::Release, &key, Some(lease.token()));
            let _ = fast.release(&lease).await;
        }
    }
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    let report = history.check();
    let violated = expired_grants > 0 || report.overlap_count > 0;
    let mut figures = BTreeMap::new();
    figures.insert("slow_grants".into(), json!(grants));
    figures.insert("slow_errors".into(), json!(errors));
    figures.insert("expired_grants_returned".into(), json!(expired_grants));
    figures.insert("overlapping_windows".into(), json!(report.overlap_count));
    Ok(ScenarioReport::judged(
        false,
        violated,
        format!(
            "{grants} slow grants ({errors} refused or timed out), {expired_grants} past their deadline; {}",
            report.summary()
        ),
        figures,
    ))
}

/// A release whose reply is lost (the client is partitioned while
/// releasing, the request delivered later) and retried must never delete
/// the next holder's lock.
pub async fn release_reply_lost(env: &ScenarioEnv) -> ScenarioReport {
    match release_reply_lost_inner(env).await {
        Ok(r) => r,
        Err(e) => ScenarioReport::failed(e),
    }
}

async fn release_reply_lost_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
    let Some((a, proxy)) = env
        .target
        .proxied_client()
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(ScenarioReport::skipped(
            "target cannot put a proxy in front of the server",
        ));
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
    match cancellation_storm_inner(env).await {
        Ok(r) => r,
        Err(e) => ScenarioReport::failed(e),
    }
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
