//! The rollout from a legacy fleet: the processes of the first phase are
//! another library's lock clients ([`LegacyPeer`]s: redis-py on the exact
//! key, kazoo on the exact path), our processes join in `dual` (whose old
//! side takes the legacy clients' lock, on the same key, in the layout they
//! use), then move to `new` on a CP store.
//!
//! Correct rollout, in five stages (`tasks` processes, each one slot of the
//! fleet): all legacy; half ours in `dual`, half still legacy; all `dual`;
//! half `new`, half `dual`; all `new`. The legacy clients are gone before
//! the first `new` process starts: they cannot see a cutover marker, so
//! nothing else could keep them out of a key a `new` process holds. The
//! checker must find no overlapping holds.
//!
//! Wrong rollout: half the fleet goes from legacy straight to `new` while
//! the other half is still legacy, for three stages. The checker must flag
//! it (overlapping holds), every run: no guard can refuse a client that
//! does not know the migration exists.
//!
//! Every holder writes once to the protected key while it holds it: ours
//! with the grant's fencing token, the legacy clients with none (they have
//! none to send), so the report also shows what an unfenced writer means
//! for the resource: nothing a resource could reject.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockKey, MigrationPhase, OwnerId};
use serde::Serialize;
use tokio::time::{Instant, sleep};

use super::{LegacyKind, LegacyPeer};
use crate::harness::Target;
use crate::history::{CheckReport, EventKind, History, Op, Recorder};
use crate::migration::{
    Process, RolloutConfig, recorded_acquire, recorded_release, run_keys, stage_ends, stage_now,
};

/// Shape of a legacy-fleet rollout.
#[derive(Clone, Debug)]
pub struct LegacyRolloutConfig {
    /// The legacy client the fleet runs first.
    pub legacy: LegacyKind,
    /// Its Python ([`legacy_python`](super::legacy_python)).
    pub python: PathBuf,
    /// Prepended to each key (`/` for kazoo, whose keys are paths).
    pub key_prefix: String,
    /// Processes (slots of the fleet).
    pub tasks: usize,
    /// Keys they contend on.
    pub keys: usize,
    /// How long each stage lasts.
    pub stage: Duration,
    /// TTL of our grants and of redis-py's locks; the migration's wait-out.
    pub ttl: Duration,
    /// How long each holder keeps a key.
    pub hold: Duration,
    /// Legacy clients beside `new` processes (the mistake).
    pub wrong: bool,
}

impl LegacyRolloutConfig {
    /// The default shape for `legacy`: 6 processes on 2 keys, 700 ms stages,
    /// 2 s TTL, 3 ms holds, the correct rollout.
    pub fn new(legacy: LegacyKind, python: PathBuf) -> Self {
        let key_prefix = match legacy {
            LegacyKind::Kazoo { .. } => "/".to_owned(),
            LegacyKind::RedisPy { .. } => String::new(),
        };
        Self {
            legacy,
            python,
            key_prefix,
            tasks: 6,
            keys: 2,
            stage: Duration::from_millis(700),
            ttl: Duration::from_secs(2),
            hold: Duration::from_millis(3),
            wrong: false,
        }
    }
}

/// What a legacy-fleet rollout saw.
#[derive(Clone, Debug, Serialize)]
pub struct LegacyRolloutReport {
    /// The history checker's findings.
    pub check: CheckReport,
    /// Grants by role: the legacy client's name, `dual`, `new`.
    pub grants: HashMap<String, usize>,
    /// Writes without a token (the legacy clients'): a resource cannot
    /// tell a stale one from a current one.
    pub unfenced_writes: usize,
}

/// Who a slot of the fleet is during a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Legacy,
    Ours(MigrationPhase),
}

fn role_at(stage: usize, task: usize, tasks: usize, wrong: bool) -> Role {
    use MigrationPhase::{Dual, New};
    let first_half = task < tasks.div_ceil(2);
    match (wrong, stage) {
        (_, 0) => Role::Legacy,
        (true, 1) if first_half => Role::Ours(New),
        (true, 1) => Role::Legacy,
        (true, _) => Role::Ours(New),
        (false, 1) if first_half => Role::Ours(Dual),
        (false, 1) => Role::Legacy,
        (false, 2) => Role::Ours(Dual),
        (false, 3) if first_half => Role::Ours(New),
        (false, 3) => Role::Ours(Dual),
        (false, _) => Role::Ours(New),
    }
}

/// One hold by a legacy client, recorded, without a token. The promised
/// window ends at the release, or `ttl` after the successful try began
/// (as the peer reports it, measured from the moment the request was sent,
/// which is no later): redis-py's key expires then at the earliest. kazoo's
/// lock lasts as long as its session; its window is `ttl` from the reply.
async fn legacy_hold(
    peer: &mut LegacyPeer,
    rec: &Recorder,
    key: &LockKey,
    config: &LegacyRolloutConfig,
) -> Result<bool, String> {
    rec.invoke(Op::Acquire, key, None);
    let sent = Instant::now();
    let Some(offset) = peer
        .acquire(key.as_str(), config.ttl, Duration::from_secs(5))
        .await?
    else {
        rec.failed(Op::Acquire, key, None);
        return Ok(false);
    };
    let now = Instant::now();
    let from = match config.legacy {
        LegacyKind::Kazoo { .. } => now,
        LegacyKind::RedisPy { .. } => sent + offset,
    };
    rec.record_at(
        now,
        EventKind::Ok,
        Op::Acquire,
        key,
        None,
        Some(from + config.ttl),
    );
    rec.wrote(key, None);
    sleep(config.hold).await;
    rec.invoke(Op::Release, key, None);
    peer.release(key.as_str()).await?;
    rec.record_at(Instant::now(), EventKind::Ok, Op::Release, key, None, None);
    Ok(true)
}

/// Runs one legacy-fleet rollout from `old` (the backend the legacy clients
/// use, opened in their layout) to `new`.
///
/// # Errors
///
/// A description of the first client, peer or backend error.
pub async fn legacy_rollout(
    old: Arc<dyn Target>,
    new: Arc<dyn Target>,
    config: LegacyRolloutConfig,
) -> Result<LegacyRolloutReport, String> {
    let ends = stage_ends(config.stage, config.wrong);
    let run_id = &OwnerId::random().to_hex()[..8];
    let name = format!("legacy-{run_id}");
    let keys = run_keys(&config.key_prefix, run_id, config.keys)?;
    let migration = RolloutConfig {
        ttl: config.ttl,
        ..RolloutConfig::default()
    };
    let history = Arc::new(History::new());
    let mut fleet = Vec::new();
    for _ in 0..config.tasks {
        let peer = LegacyPeer::start(&config.python, &config.legacy).await?;
        let ours = Process::start(old.as_ref(), new.as_ref(), &migration, &name).await?;
        fleet.push((peer, ours));
    }
    let started = Instant::now();
    let end = started + ends.last().copied().unwrap_or_default();
    let mut handles = Vec::new();
    for (task, (mut peer, ours)) in fleet.into_iter().enumerate() {
        let (history, keys, ends, config) =
            (history.clone(), keys.clone(), ends.clone(), config.clone());
        handles.push(tokio::spawn(async move {
            let rec = history.process();
            let mut grants: HashMap<String, usize> = HashMap::new();
            let mut i = task;
            while Instant::now() < end {
                let stage = stage_now(started, &ends);
                i += 1;
                let key = &keys[i % keys.len()];
                match role_at(stage, task, config.tasks, config.wrong) {
                    Role::Legacy => {
                        if legacy_hold(&mut peer, &rec, key, &config).await? {
                            *grants.entry(peer.kind().to_owned()).or_default() += 1;
                        }
                    }
                    Role::Ours(phase) => {
                        let backend = ours.at(phase);
                        let Some(lease) = recorded_acquire(backend, &rec, key, config.ttl).await?
                        else {
                            return Err(format!("a {} process was refused", phase.as_str()));
                        };
                        *grants.entry(phase.as_str().to_owned()).or_default() += 1;
                        rec.wrote(key, Some(lease.token()));
                        sleep(config.hold).await;
                        recorded_release(backend, &rec, &lease).await?;
                    }
                }
            }
            Ok::<_, String>(grants)
        }));
    }
    let mut grants: HashMap<String, usize> = HashMap::new();
    for handle in handles {
        for (role, n) in handle.await.map_err(|e| format!("task panicked: {e}"))?? {
            *grants.entry(role).or_default() += n;
        }
    }
    let events = history.events();
    let unfenced_writes = events
        .iter()
        .filter(|e| e.op == Op::Write && e.token.is_none())
        .count();
    Ok(LegacyRolloutReport {
        check: history.check(),
        grants,
        unfenced_writes,
    })
}

/// What the correct and the wrong legacy rollouts saw.
#[derive(Clone, Debug, Serialize)]
pub struct LegacyVerdicts {
    /// The correct rollouts (legacy → dual → new), one per run.
    pub correct: Vec<LegacyRolloutReport>,
    /// The wrong ones (legacy beside new), one per run.
    pub wrong: Vec<LegacyRolloutReport>,
}

/// Runs the correct and the wrong legacy rollout `runs` times each, and
/// checks every verdict: each correct one has no overlapping hold and a
/// grant in every role; each wrong one is flagged.
///
/// # Errors
///
/// What went wrong, with the report's summary.
pub async fn legacy_rollout_is_guarded(
    old: Arc<dyn Target>,
    new: Arc<dyn Target>,
    config: LegacyRolloutConfig,
    runs: usize,
) -> Result<LegacyVerdicts, String> {
    let mut verdicts = LegacyVerdicts {
        correct: Vec::new(),
        wrong: Vec::new(),
    };
    let legacy = config.legacy.name();
    for run in 0..runs {
        let correct = legacy_rollout(old.clone(), new.clone(), config.clone()).await?;
        if !correct.check.is_exclusive() {
            return Err(format!(
                "run {run}: the correct rollout from {legacy} had overlapping holds: {}",
                correct.check.summary()
            ));
        }
        for role in [legacy, "dual", "new"] {
            if correct.grants.get(role).copied().unwrap_or(0) == 0 {
                return Err(format!(
                    "run {run}: no grant for {role}: {:?}",
                    correct.grants
                ));
            }
        }
        let wrong = legacy_rollout(
            old.clone(),
            new.clone(),
            LegacyRolloutConfig {
                wrong: true,
                ..config.clone()
            },
        )
        .await?;
        if wrong.check.overlap_count == 0 {
            return Err(format!(
                "run {run}: the wrong rollout ({legacy} beside new) was not flagged: {}",
                wrong.check.summary()
            ));
        }
        verdicts.correct.push(correct);
        verdicts.wrong.push(wrong);
    }
    Ok(verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_clients_are_gone_before_new_starts() {
        for tasks in 1..8 {
            for stage in 0..5 {
                let roles: Vec<Role> = (0..tasks)
                    .map(|t| role_at(stage, t, tasks, false))
                    .collect();
                let legacy = roles.contains(&Role::Legacy);
                let new = roles.contains(&Role::Ours(MigrationPhase::New));
                assert!(!(legacy && new), "stage {stage} of {tasks}: {roles:?}");
            }
            // The wrong rollout mixes them (when there are two halves).
            if tasks > 1 {
                let roles: Vec<Role> = (0..tasks).map(|t| role_at(1, t, tasks, true)).collect();
                assert!(roles.contains(&Role::Legacy));
                assert!(roles.contains(&Role::Ours(MigrationPhase::New)));
            }
        }
    }
}
