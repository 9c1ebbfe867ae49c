//! The rollout simulation: many tasks contend on a few keys while their
//! migration phases move `old → dual → new` in stages, adjacent phases
//! overlapping in time, and a **straggler** (a process still on `old`,
//! waiting behind a `dual` holder when the fleet moves to `new`) tries to
//! take its key after the cutover. The checker must find no overlapping
//! holds, and the straggler must be **refused** (it observes the cutover
//! error), not merely flagged afterwards.
//!
//! Two more runs check the guard itself: a deliberately wrong rollout
//! (`old` straight to `new` while others are still on `old`) must see the
//! `old` processes refused and no overlap; and the same correct rollout
//! with `old` processes that cannot see the cutover marker (a broken
//! variant standing for the code before the guard, [`BlindToCutover`])
//! must be flagged by the checker: the straggler then holds beside `new`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockBackendExt;
use lock_core::{
    CUTOVER_KEY_PREFIX, ErrorKind, HolderInfo, Lease, LockBackend, LockError, LockKey, LockShape,
    LockWrapper, MigrationBackend, MigrationPhase, OwnerId,
};
use serde::Serialize;
use tokio::time::{Instant, sleep, sleep_until};

use crate::harness::Target;
use crate::history::{CheckReport, FencedResource, History, Op, Recorder};

/// Shape of a rollout run.
#[derive(Clone, Copy, Debug)]
pub struct RolloutConfig {
    /// Contending tasks (each its own pair of clients, like a process).
    pub tasks: usize,
    /// Keys they contend on.
    pub keys: usize,
    /// How long each stage lasts (the wrong rollout's middle stage lasts
    /// three).
    pub stage: Duration,
    /// Skip `dual`: half the fleet jumps `old → new` while the rest is on
    /// `old` (the mistake the playbook forbids).
    pub wrong: bool,
    /// TTL of each grant, and the migration's wait-out (the longest old
    /// lease).
    pub ttl: Duration,
    /// Add the straggler: a `dual` holder, an `old` waiter behind it, then
    /// a `new` process on the same key (correct rollout only).
    pub straggler: bool,
    /// Broken on purpose: processes in phase `old` cannot see the cutover
    /// marker (what every `old` process was before the cutover guard).
    pub blind_old: bool,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            tasks: 6,
            keys: 2,
            stage: Duration::from_millis(600),
            wrong: false,
            ttl: Duration::from_secs(1),
            straggler: true,
            blind_old: false,
        }
    }
}

/// What a rollout run saw.
#[derive(Clone, Debug, Serialize)]
pub struct RolloutReport {
    /// The history checker's findings.
    pub check: CheckReport,
    /// Fenced writes accepted, over all keys.
    pub writes_accepted: u64,
    /// Fenced writes rejected as stale (the liveness cost of the rollout).
    pub writes_rejected: u64,
    /// Grants per phase (`old`, `dual`, `new`).
    pub grants_by_phase: HashMap<&'static str, usize>,
    /// `old`-phase acquires of the contending tasks refused because the
    /// fleet had cut over.
    pub refusals: usize,
    /// The straggler's outcome: `refused` (it saw the cutover error),
    /// `held` (it got the key), `lost` (it got the key and a renewal was
    /// refused), or `none` (no straggler in this run).
    pub straggler: &'static str,
}

/// The phase of task `task` (of `tasks`) during `stage`.
pub fn phase_at(stage: usize, task: usize, tasks: usize, wrong: bool) -> MigrationPhase {
    use MigrationPhase::{Dual, New, Old};
    let first_half = task < tasks.div_ceil(2);
    if wrong {
        match stage {
            0 => Old,
            1 if first_half => New,
            1 => Old,
            _ => New,
        }
    } else {
        match stage {
            0 => Old,
            1 if first_half => Dual,
            1 => Old,
            2 => Dual,
            3 if first_half => New,
            3 => Dual,
            _ => New,
        }
    }
}

/// When each stage ends, from the start of the run: five stages of
/// `stage`, or for a wrong rollout three with a middle one three times as
/// long (so `new` runs past its wait-out while the other half is still on
/// the first phase).
pub(crate) fn stage_ends(stage: Duration, wrong: bool) -> Vec<Duration> {
    if wrong {
        vec![stage, stage * 4, stage * 5]
    } else {
        (1..=5).map(|i| stage * i).collect()
    }
}

/// The stage a run that began at `started` is in now (the last one once
/// they are all over).
pub(crate) fn stage_now(started: Instant, ends: &[Duration]) -> usize {
    let elapsed = started.elapsed();
    ends.iter()
        .position(|e| elapsed < *e)
        .unwrap_or(ends.len().saturating_sub(1))
}

/// The keys of one run: `<prefix>rollout-<run id>/<i>`.
pub(crate) fn run_keys(prefix: &str, run_id: &str, n: usize) -> Result<Vec<LockKey>, String> {
    (0..n)
        .map(|i| LockKey::new(format!("{prefix}rollout-{run_id}/{i}")).map_err(|e| e.to_string()))
        .collect()
}

/// An old-backend client that never sees a cutover marker: the mutex
/// holders (`inspect`) of a key under [`CUTOVER_KEY_PREFIX`] say "free".
/// Broken on purpose, to show that the checker catches the straggler when
/// the guard is missing.
#[derive(Debug)]
pub struct BlindToCutover(pub Arc<dyn LockBackend>);

#[async_trait]
impl LockWrapper for BlindToCutover {
    fn inner(&self) -> &dyn LockBackend {
        &*self.0
    }
    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        if shape == LockShape::Mutex && key.as_str().starts_with(CUTOVER_KEY_PREFIX) {
            return Ok(Vec::new());
        }
        self.0.holders(key, shape).await
    }
}

/// One simulated process: its backend in each phase.
pub(crate) struct Process {
    old: MigrationBackend,
    dual: MigrationBackend,
    new: MigrationBackend,
}

impl Process {
    pub(crate) async fn start(
        old: &dyn Target,
        new: &dyn Target,
        config: &RolloutConfig,
        name: &str,
    ) -> Result<Self, String> {
        let old_client = old.client().await.map_err(|e| format!("old client: {e}"))?;
        let new_client = new.client().await.map_err(|e| format!("new client: {e}"))?;
        let build = |old: Arc<dyn LockBackend>, phase| {
            MigrationBackend::new(old, new_client.clone(), phase)
                .with_name(name)
                .map(|b| b.with_old_lease_max(config.ttl))
                .map_err(|e| e.to_string())
        };
        let old_side: Arc<dyn LockBackend> = if config.blind_old {
            Arc::new(BlindToCutover(old_client.clone()))
        } else {
            old_client.clone()
        };
        Ok(Self {
            old: build(old_side, MigrationPhase::Old)?,
            dual: build(old_client.clone(), MigrationPhase::Dual)?,
            new: build(old_client, MigrationPhase::New)?,
        })
    }

    pub(crate) fn at(&self, phase: MigrationPhase) -> &MigrationBackend {
        match phase {
            MigrationPhase::Old => &self.old,
            MigrationPhase::Dual => &self.dual,
            MigrationPhase::New => &self.new,
        }
    }
}

/// The refusal the cutover guard gives a straggler.
fn is_cutover_refusal(err: &LockError) -> bool {
    matches!(err.kind(), ErrorKind::Config | ErrorKind::LeaseLost)
        && err.message().contains("moved to the new backend")
}

/// Acquires through `backend`, recording it; `Ok(None)` for a cutover
/// refusal.
pub(crate) async fn recorded_acquire(
    backend: &MigrationBackend,
    rec: &Recorder,
    key: &LockKey,
    ttl: Duration,
) -> Result<Option<Lease>, String> {
    rec.invoke(Op::Acquire, key, None);
    match backend
        .acquire(key, ttl, Instant::now() + Duration::from_secs(10))
        .await
    {
        Ok(lease) => {
            rec.acquired(key, lease.token(), lease.validity_deadline());
            Ok(Some(lease))
        }
        Err(e) => {
            rec.failed(Op::Acquire, key, None);
            if is_cutover_refusal(&e) {
                Ok(None)
            } else {
                Err(format!(
                    "acquire in phase {}: {e}",
                    backend.phase().as_str()
                ))
            }
        }
    }
}

pub(crate) async fn recorded_release(
    backend: &MigrationBackend,
    rec: &Recorder,
    lease: &Lease,
) -> Result<(), String> {
    crate::recording::recorded_release(backend, rec, lease)
        .await
        .map_err(|e| format!("release in phase {}: {e}", backend.phase().as_str()))?;
    Ok(())
}

/// Holds `lease` for `hold`, renewing every TTL/3 as a guard would;
/// `false` when a renewal was refused (recorded as lost).
async fn hold_renewing(
    backend: &MigrationBackend,
    rec: &Recorder,
    lease: &Lease,
    hold: Duration,
) -> Result<bool, String> {
    let until = Instant::now() + hold;
    let interval = lease.ttl() / 3;
    while Instant::now() < until {
        sleep(interval.min(until.saturating_duration_since(Instant::now()))).await;
        rec.invoke(Op::Renew, lease.key(), Some(lease.token()));
        match backend.renew(lease).await {
            Ok(deadline) => rec.renewed(lease.key(), lease.token(), deadline),
            Err(e) if is_cutover_refusal(&e) || e.is_not_held() || e.is_lost() => {
                rec.failed(Op::Renew, lease.key(), Some(lease.token()));
                rec.lost(lease.key(), lease.token());
                return Ok(false);
            }
            Err(e) => return Err(format!("straggler renew: {e}")),
        }
    }
    Ok(true)
}

/// Runs the rollout simulation from `old` to `new`.
///
/// # Errors
///
/// A description of the first client or backend error.
pub async fn rollout(
    old: Arc<dyn Target>,
    new: Arc<dyn Target>,
    config: RolloutConfig,
) -> Result<RolloutReport, String> {
    let ends = stage_ends(config.stage, config.wrong);
    let run_id = &OwnerId::random().to_hex()[..8];
    // One migration name per run: each run cuts over afresh.
    let name = format!("rollout-{run_id}");
    let keys = run_keys("", run_id, config.keys)?;
    let resources: Arc<Vec<FencedResource>> =
        Arc::new((0..=config.keys).map(|_| FencedResource::new()).collect());
    let history = Arc::new(History::new());
    let started = Instant::now();
    let end = started + ends.last().copied().unwrap_or_default();
    let mut handles = Vec::new();
    for task in 0..config.tasks {
        let process = Process::start(old.as_ref(), new.as_ref(), &config, &name).await?;
        let (history, resources, keys, ends) = (
            history.clone(),
            resources.clone(),
            keys.clone(),
            ends.clone(),
        );
        handles.push(tokio::spawn(async move {
            let rec = history.process();
            let mut grants: HashMap<&'static str, usize> = HashMap::new();
            let mut refusals = 0;
            let mut i = task;
            while Instant::now() < end {
                let stage = stage_now(started, &ends);
                let phase = phase_at(stage, task, config.tasks, config.wrong);
                let backend = process.at(phase);
                i += 1;
                let k = i % keys.len();
                let key = &keys[k];
                let Some(lease) = recorded_acquire(backend, &rec, key, config.ttl).await? else {
                    refusals += 1;
                    sleep(Duration::from_millis(5)).await;
                    continue;
                };
                *grants.entry(phase.as_str()).or_default() += 1;
                resources[k].write(&rec, key, lease.token(), |v| *v += 1);
                sleep(Duration::from_millis(2)).await;
                recorded_release(backend, &rec, &lease).await?;
            }
            Ok::<_, String>((grants, refusals))
        }));
    }
    let straggler = if config.straggler && !config.wrong {
        Some(tokio::spawn(straggler_scene(
            old.clone(),
            new.clone(),
            config,
            name.clone(),
            history.clone(),
            resources.clone(),
            LockKey::new(format!("rollout-{run_id}/straggler")).map_err(|e| e.to_string())?,
            started,
        )))
    } else {
        None
    };
    let mut grants_by_phase: HashMap<&'static str, usize> = HashMap::new();
    let mut refusals = 0;
    for handle in handles {
        let (grants, refused) = handle.await.map_err(|e| format!("task panicked: {e}"))??;
        refusals += refused;
        for (phase, n) in grants {
            *grants_by_phase.entry(phase).or_default() += n;
        }
    }
    let straggler = match straggler {
        Some(handle) => handle
            .await
            .map_err(|e| format!("straggler panicked: {e}"))??,
        None => "none",
    };
    Ok(RolloutReport {
        check: history.check(),
        writes_accepted: resources.iter().map(FencedResource::accepted).sum(),
        writes_rejected: resources.iter().map(FencedResource::rejected).sum(),
        grants_by_phase,
        refusals,
        straggler,
    })
}

/// The straggler scene, on its own key: a `dual` holder from stage 2
/// until just after the first `new` processes start (stage 3); an `old`
/// waiter behind it (a process that was never redeployed); a `new`
/// process that wants the key after the cutover. Returns the straggler's
/// outcome.
#[allow(clippy::too_many_arguments)]
async fn straggler_scene(
    old: Arc<dyn Target>,
    new: Arc<dyn Target>,
    config: RolloutConfig,
    name: String,
    history: Arc<History>,
    resources: Arc<Vec<FencedResource>>,
    key: LockKey,
    started: Instant,
) -> Result<&'static str, String> {
    let s = config.stage;
    let resource = config.keys;
    let holder = Process::start(old.as_ref(), new.as_ref(), &config, &name).await?;
    let waiter = Process::start(old.as_ref(), new.as_ref(), &config, &name).await?;
    let newcomer = Process::start(old.as_ref(), new.as_ref(), &config, &name).await?;

    let holder = {
        let (history, resources, key) = (history.clone(), resources.clone(), key.clone());
        async move {
            let rec = history.process();
            sleep_until(started + s * 2 + s / 6).await;
            let backend = holder.at(MigrationPhase::Dual);
            let lease = recorded_acquire(backend, &rec, &key, config.ttl)
                .await?
                .ok_or("the dual holder was refused")?;
            resources[resource].write(&rec, &key, lease.token(), |v| *v += 1);
            if !hold_renewing(
                backend,
                &rec,
                &lease,
                (started + s * 3 + s / 2).saturating_duration_since(Instant::now()),
            )
            .await?
            {
                return Err("the dual holder lost its lock".to_owned());
            }
            recorded_release(backend, &rec, &lease).await
        }
    };
    let straggler = {
        let (history, resources, key) = (history.clone(), resources.clone(), key.clone());
        async move {
            let rec = history.process();
            sleep_until(started + s * 2 + s / 3).await;
            let backend = waiter.at(MigrationPhase::Old);
            let Some(lease) = recorded_acquire(backend, &rec, &key, config.ttl).await? else {
                return Ok::<_, String>("refused");
            };
            resources[resource].write(&rec, &key, lease.token(), |v| *v += 1);
            // Holds as `distlock run` would, renewing for twice the TTL.
            let kept = hold_renewing(backend, &rec, &lease, config.ttl * 2).await?;
            if kept {
                resources[resource].write(&rec, &key, lease.token(), |v| *v += 1);
            }
            recorded_release(backend, &rec, &lease).await?;
            Ok(if kept { "held" } else { "lost" })
        }
    };
    let newcomer = async move {
        let rec = history.process();
        sleep_until(started + s * 3 + s / 6).await;
        let backend = newcomer.at(MigrationPhase::New);
        let lease = recorded_acquire(backend, &rec, &key, config.ttl)
            .await?
            .ok_or("the new process was refused")?;
        resources[resource].write(&rec, &key, lease.token(), |v| *v += 1);
        sleep(s / 3).await;
        resources[resource].write(&rec, &key, lease.token(), |v| *v += 1);
        recorded_release(backend, &rec, &lease).await
    };
    let (held, outcome, came) = tokio::join!(holder, straggler, newcomer);
    held?;
    came?;
    outcome
}

/// What the three rollout runs saw.
#[derive(Clone, Debug, Serialize)]
pub struct RolloutVerdicts {
    /// The correct rollout, with the straggler.
    pub correct: RolloutReport,
    /// The wrong rollout (`old` and `new` together).
    pub wrong: RolloutReport,
    /// The correct rollout with `old` processes blind to the cutover.
    pub blind: RolloutReport,
}

impl RolloutVerdicts {
    /// One line per run (`correct`, `wrong`, `blind`) for a test's log: the
    /// checker's summary, grants per phase, fenced writes accepted and
    /// rejected, `old` refusals and the straggler's outcome.
    pub fn lines(&self) -> Vec<String> {
        [
            ("correct", &self.correct),
            ("wrong", &self.wrong),
            ("blind", &self.blind),
        ]
        .into_iter()
        .map(|(name, report)| {
            format!(
                "{name:>7}: {} ; grants {:?} ; fenced writes accepted {} rejected {} ; old \
                 refusals {} ; straggler {}",
                report.check.summary(),
                report.grants_by_phase,
                report.writes_accepted,
                report.writes_rejected,
                report.refusals,
                report.straggler
            )
        })
        .collect()
    }
}

/// Runs the correct rollout (with its straggler), the wrong one, and the
/// correct one with a broken `old` side, and checks each verdict: the
/// correct one exclusive with the straggler refused; the wrong one
/// exclusive with its `old` processes refused; the blind one flagged.
///
/// # Errors
///
/// What went wrong, with the report's summary.
pub async fn rollout_is_guarded(
    old: Arc<dyn Target>,
    new: Arc<dyn Target>,
) -> Result<RolloutVerdicts, String> {
    let correct = rollout(old.clone(), new.clone(), RolloutConfig::default()).await?;
    if !correct.check.is_exclusive() {
        return Err(format!(
            "correct rollout had overlapping holds: {}",
            correct.check.summary()
        ));
    }
    for phase in ["old", "dual", "new"] {
        if correct.grants_by_phase.get(phase).copied().unwrap_or(0) == 0 {
            return Err(format!(
                "no grant in phase {phase}: {:?}",
                correct.grants_by_phase
            ));
        }
    }
    if correct.straggler != "refused" {
        return Err(format!(
            "the straggler on `old` was not refused ({}): {}",
            correct.straggler,
            correct.check.summary()
        ));
    }
    let wrong = rollout(
        old.clone(),
        new.clone(),
        RolloutConfig {
            wrong: true,
            ..RolloutConfig::default()
        },
    )
    .await?;
    if !wrong.check.is_exclusive() || wrong.refusals == 0 {
        return Err(format!(
            "the wrong rollout (old and new together) was not guarded: {} refusal(s); {}",
            wrong.refusals,
            wrong.check.summary()
        ));
    }
    let blind = rollout(
        old,
        new,
        RolloutConfig {
            blind_old: true,
            ..RolloutConfig::default()
        },
    )
    .await?;
    if blind.check.overlap_count == 0 || blind.straggler != "held" {
        return Err(format!(
            "the straggler blind to the cutover was not caught (straggler {}): {}",
            blind.straggler,
            blind.check.summary()
        ));
    }
    Ok(RolloutVerdicts {
        correct,
        wrong,
        blind,
    })
}

/// A client of a target, for callers that build migration backends by hand.
///
/// # Errors
///
/// The target's connection error, as text.
pub async fn client_of(target: &dyn Target) -> Result<Arc<dyn LockBackend>, String> {
    target.client().await.map_err(|e| e.to_string())
}
