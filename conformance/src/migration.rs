//! The rollout simulation: many tasks contend on a few keys while their
//! migration phases move `old → dual → new` in stages, adjacent phases
//! overlapping in time. The checker must find no overlapping holds; a
//! deliberately wrong rollout (`old` straight to `new` while others are
//! still on `old`) must be flagged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockBackend, LockKey, MigrationBackend, MigrationPhase, OwnerId};
use serde::Serialize;
use tokio::time::{Instant, sleep};

use crate::harness::Target;
use crate::history::{CheckReport, FencedResource, History, Op};

/// Shape of a rollout run.
#[derive(Clone, Copy, Debug)]
pub struct RolloutConfig {
    /// Contending tasks (each its own pair of clients, like a process).
    pub tasks: usize,
    /// Keys they contend on.
    pub keys: usize,
    /// How long each stage lasts.
    pub stage: Duration,
    /// Skip `dual`: half the fleet jumps `old → new` while the rest is on
    /// `old` (the mistake the playbook forbids).
    pub wrong: bool,
    /// TTL of each grant.
    pub ttl: Duration,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            tasks: 6,
            keys: 2,
            stage: Duration::from_millis(600),
            wrong: false,
            ttl: Duration::from_secs(5),
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
    let stages = if config.wrong { 3 } else { 5 };
    let run_id = &OwnerId::random().to_hex()[..8];
    let keys: Vec<LockKey> = (0..config.keys)
        .map(|i| LockKey::new(format!("rollout-{run_id}/{i}")).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let resources: Arc<Vec<FencedResource>> =
        Arc::new((0..config.keys).map(|_| FencedResource::new()).collect());
    let history = Arc::new(History::new());
    let started = Instant::now();
    let end = started + config.stage * u32::try_from(stages).unwrap_or(5);
    let mut handles = Vec::new();
    for task in 0..config.tasks {
        let old_client = old.client().await.map_err(|e| format!("old client: {e}"))?;
        let new_client = new.client().await.map_err(|e| format!("new client: {e}"))?;
        let (history, resources, keys) = (history.clone(), resources.clone(), keys.clone());
        handles.push(tokio::spawn(async move {
            let rec = history.process();
            let mut grants: HashMap<&'static str, usize> = HashMap::new();
            let mut i = task;
            while Instant::now() < end {
                let elapsed = started.elapsed().as_nanos() / config.stage.as_nanos().max(1);
                let stage = usize::try_from(elapsed)
                    .unwrap_or(usize::MAX)
                    .min(stages - 1);
                let phase = phase_at(stage, task, config.tasks, config.wrong);
                let backend = MigrationBackend::new(old_client.clone(), new_client.clone(), phase);
                i += 1;
                let k = i % keys.len();
                let key = &keys[k];
                rec.invoke(Op::Acquire, key, None);
                let lease = match backend
                    .acquire(key, config.ttl, Instant::now() + Duration::from_secs(10))
                    .await
                {
                    Ok(lease) => lease,
                    Err(e) => {
                        rec.failed(Op::Acquire, key, None);
                        return Err(format!("acquire in phase {}: {e}", phase.as_str()));
                    }
                };
                rec.acquired(key, lease.token(), lease.validity_deadline());
                *grants.entry(phase.as_str()).or_default() += 1;
                resources[k].write(&rec, key, lease.token(), |v| *v += 1);
                sleep(Duration::from_millis(2)).await;
                rec.invoke(Op::Release, key, Some(lease.token()));
                let held = backend
                    .release(&lease)
                    .await
                    .map_err(|e| format!("release in phase {}: {e}", phase.as_str()))?;
                rec.released(key, lease.token(), held);
            }
            Ok::<_, String>(grants)
        }));
    }
    let mut grants_by_phase: HashMap<&'static str, usize> = HashMap::new();
    for handle in handles {
        let grants = handle.await.map_err(|e| format!("task panicked: {e}"))??;
        for (phase, n) in grants {
            *grants_by_phase.entry(phase).or_default() += n;
        }
    }
    Ok(RolloutReport {
        check: history.check(),
        writes_accepted: resources.iter().map(FencedResource::accepted).sum(),
        writes_rejected: resources.iter().map(FencedResource::rejected).sum(),
        grants_by_phase,
    })
}

/// Runs the correct rollout and the wrong one and checks both verdicts:
/// the correct one exclusive, the wrong one flagged.
///
/// # Errors
///
/// What went wrong, with both reports' summaries.
pub async fn rollout_is_safe_and_wrong_rollout_is_flagged(
    old: Arc<dyn Target>,
    new: Arc<dyn Target>,
) -> Result<(RolloutReport, RolloutReport), String> {
    let good = rollout(old.clone(), new.clone(), RolloutConfig::default()).await?;
    if !good.check.is_exclusive() {
        return Err(format!(
            "correct rollout had overlapping holds: {}",
            good.check.summary()
        ));
    }
    for phase in ["old", "dual", "new"] {
        if good.grants_by_phase.get(phase).copied().unwrap_or(0) == 0 {
            return Err(format!(
                "no grant in phase {phase}: {:?}",
                good.grants_by_phase
            ));
        }
    }
    let wrong = rollout(
        old,
        new,
        RolloutConfig {
            wrong: true,
            ..RolloutConfig::default()
        },
    )
    .await?;
    if wrong.check.overlap_count == 0 {
        return Err(format!(
            "the wrong rollout (old and new together) was not flagged: {}",
            wrong.check.summary()
        ));
    }
    Ok((good, wrong))
}

/// A client of a target, for callers that build migration backends by hand.
///
/// # Errors
///
/// The target's connection error, as text.
pub async fn client_of(target: &dyn Target) -> Result<Arc<dyn LockBackend>, String> {
    target.client().await.map_err(|e| e.to_string())
}
