//! Scenarios around the server and the link: a restart, injected latency,
//! a lost release reply, a storm of cancelled acquires.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_core::LockBackendExt;
use lock_core::{LockBackend, LockKey};
use serde_json::json;
use tokio::time::{Instant, sleep, timeout};

use crate::history::{EventKind, History, Op};
use crate::recording::{RecordingBackend, recorded_guard};

use super::*;

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

pub(super) async fn server_restarted_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
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

pub(super) async fn latency_injected_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
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
pub(super) fn probe_grants_so_far(history: &History, process: u64) -> usize {
    history
        .events()
        .iter()
        .filter(|e| e.process == process && e.op == Op::Acquire && e.kind == EventKind::Ok)
        .count()
}

pub(super) fn guard_state_text(lost_at: Option<Duration>) -> String {
    lost_at.map_or_else(|| "still held".to_owned(), |at| format!("ended by {at:?}"))
}

/// A release whose reply is lost (the client is partitioned while
/// releasing, the request delivered later) and retried must never delete
/// the next holder's lock.
pub async fn release_reply_lost(env: &ScenarioEnv) -> ScenarioReport {
    finish(release_reply_lost_inner(env).await)
}

pub(super) async fn release_reply_lost_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
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

pub(super) async fn cancellation_storm_inner(env: &ScenarioEnv) -> Result<ScenarioReport, String> {
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
                // An acquire that completed before its cut is a grant like
                // any other: given back, so that what is checked is what
                // the cancelled ones left (where leases are per process,
                // an unreleased grant would last with its client).
                if let Ok(Ok(lease)) = timeout(
                    cut,
                    stormer.acquire(&key, ttl, Instant::now() + Duration::from_secs(5)),
                )
                .await
                {
                    let _ = stormer.release(&lease).await;
                }
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
