//! Scenarios of replicated and clustered deployments: a failover, a
//! minority and a majority of nodes down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::LockBackendExt;
use lock_core::TtlModel;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, timeout};

use crate::cases::recorded_acquire;
use crate::history::{FencedResource, History, Op};

use super::*;

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

pub(super) async fn replica_failover_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
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
pub(super) struct ContentionFigures {
    pub(super) grants_before: usize,
    pub(super) grants_after: usize,
    pub(super) acquire_errors: usize,
    pub(super) first_grant_after: Option<Duration>,
    pub(super) max_gap_after: Duration,
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

pub(super) async fn minority_down_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
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

pub(super) async fn majority_down_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
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
