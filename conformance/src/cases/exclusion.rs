//! Cases on who holds: mutual exclusion, fencing tokens, only the owner
//! releases or renews, a stale release is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{ErrorKind, FencingScope, FencingToken, Lease, OwnerId};
use tokio::time::{Instant, sleep};

use crate::harness::Harness;
use crate::history::{FencedResource, History};

use super::*;

/// N tasks x M iterations on one key over several clients: a shared
/// "currently inside" counter must never exceed 1, a read-sleep-write
/// counter must lose no increment, and the history checker must find no
/// overlapping promised windows.
pub async fn mutual_exclusion(h: &Harness) -> CaseResult {
    let cfg = *h.config();
    let clients = clients(h, cfg.clients).await?;
    let ttl = h
        .ttl_for(&clients[0].capabilities())
        .max(Duration::from_secs(5));
    let key = h.key("mutex");
    let history = Arc::new(History::new());
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(std::sync::Mutex::new(0u64));
    let mut tasks = Vec::new();
    for t in 0..cfg.tasks {
        let backend = clients[t % clients.len()].clone();
        let rec = history.process();
        let (key, inside, max_inside, counter) = (
            key.clone(),
            inside.clone(),
            max_inside.clone(),
            counter.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..cfg.iterations {
                let ((), held) = recorded_turn(&*backend, &rec, &key, ttl, async |_| {
                    let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside.fetch_max(now_inside, Ordering::SeqCst);
                    let read = *counter.lock().expect("counter");
                    tokio::task::yield_now().await;
                    sleep(Duration::from_micros(200)).await;
                    *counter.lock().expect("counter") = read + 1;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
                .await?;
                if !held {
                    return Err(lock_core::LockError::new(
                        ErrorKind::NotHeld,
                        lock_core::Operation::Release,
                        "lease was no longer held at release (expired mid-section?)",
                    ));
                }
            }
            Ok::<(), lock_core::LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| format!("task panicked: {e}"))?
            .map_err(fmt_err("contention task"))?;
    }
    let expected = u64::try_from(cfg.tasks * cfg.iterations).unwrap_or(u64::MAX);
    let report = history.check();
    let value = *counter.lock().expect("counter");
    let max = max_inside.load(Ordering::SeqCst);
    ensure!(
        report.is_exclusive(),
        "checker: {} ; first overlaps: {:?}",
        report.summary(),
        report.overlaps.first()
    );
    ensure!(
        max == 1,
        "{max} tasks were inside the critical section at once"
    );
    ensure!(
        value == expected,
        "lost updates: counter is {value}, expected {expected}"
    );
    Ok(Outcome::Passed(format!(
        "{} tasks x {} iterations over {} clients; {}",
        cfg.tasks,
        cfg.iterations,
        clients.len(),
        report.summary()
    )))
}

/// One turn of a contending task: waits (up to a minute) for `key`,
/// recorded, runs `section` with the grant's token, then releases,
/// recorded. What `section` returned, and whether the lease was still held
/// at the release.
async fn recorded_turn<T>(
    backend: &dyn LockBackend,
    rec: &Recorder,
    key: &LockKey,
    ttl: Duration,
    section: impl AsyncFnOnce(FencingToken) -> T,
) -> Result<(T, bool), lock_core::LockError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let lease = recorded_acquire(backend, rec, key, ttl, deadline).await?;
    let out = section(lease.token()).await;
    let held = recorded_release(backend, rec, &lease).await?;
    Ok((out, held))
}

/// At least `fencing_grants` contended grants of one key: tokens strictly
/// increase in grant order, and a fenced resource rejects nothing.
pub async fn fencing_tokens_increase(h: &Harness) -> CaseResult {
    let cfg = *h.config();
    let clients = clients(h, cfg.clients).await?;
    let caps = clients[0].capabilities();
    if caps.fencing == FencingScope::None {
        return Ok(Outcome::Skipped("backend has no fencing tokens".into()));
    }
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("fencing");
    let history = Arc::new(History::new());
    let resource = Arc::new(FencedResource::new());
    let remaining = Arc::new(AtomicUsize::new(cfg.fencing_grants));
    let tasks_n = cfg.tasks.clamp(1, 4);
    let mut tasks = Vec::new();
    for t in 0..tasks_n {
        let backend = clients[t % clients.len()].clone();
        let rec = history.process();
        let (key, resource, remaining) = (key.clone(), resource.clone(), remaining.clone());
        tasks.push(tokio::spawn(async move {
            let mut rejected = 0u64;
            while remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let (written, _) = recorded_turn(&*backend, &rec, &key, ttl, async |token| {
                    let written = resource.write(&rec, &key, token, |v| *v += 1);
                    // Hold across a scheduling point so the other tasks
                    // really contend (with a fast backend they would
                    // otherwise rarely see the key held).
                    tokio::task::yield_now().await;
                    written
                })
                .await?;
                if !written {
                    rejected += 1;
                }
            }
            Ok::<u64, lock_core::LockError>(rejected)
        }));
    }
    let mut rejected = 0;
    for task in tasks {
        rejected += task
            .await
            .map_err(|e| format!("task panicked: {e}"))?
            .map_err(fmt_err("fencing task"))?;
    }
    let report = history.check();
    ensure!(
        report.is_safe_with_fencing(),
        "checker: {}",
        report.summary()
    );
    ensure!(
        rejected == 0,
        "the fenced resource rejected {rejected} write(s) from current holders"
    );
    ensure!(
        report.grants >= cfg.fencing_grants,
        "only {} grants recorded",
        report.grants
    );
    Ok(Outcome::Passed(format!(
        "{tasks_n} tasks; {}",
        report.summary()
    )))
}

/// A lease with another owner id cannot release or renew the holder's
/// grant; the holder still can.
pub async fn only_owner_can_release_or_renew(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let key = h.key("owner");
    let lease = take_free(&*a, &key, ttl).await?;
    let forged = Lease::from_parts(
        key.clone(),
        OwnerId::random(),
        lease.token(),
        lease.ttl(),
        lease.validity_deadline(),
        lease.backend_data().to_owned(),
    );
    let released = b
        .release(&forged)
        .await
        .map_err(fmt_err("release (forged)"))?;
    ensure!(
        !released,
        "a lease with a different owner released the holder's grant"
    );
    match b.renew(&forged).await {
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        other => {
            return Err(format!(
                "renew with a different owner: expected NotHeld, got {other:?}"
            ));
        }
    }
    let info = b.inspect(&key).await.map_err(fmt_err("inspect"))?;
    ensure!(
        info.as_ref().and_then(|i| i.token) == Some(lease.token())
            || (info.is_some() && !a.capabilities().has_fencing()),
        "holder changed after foreign release: {info:?}"
    );
    a.renew(&lease).await.map_err(fmt_err("owner renew"))?;
    ensure!(
        a.release(&lease).await.map_err(fmt_err("owner release"))?,
        "owner release said not held"
    );
    Ok(Outcome::Passed(
        "foreign release/renew refused; owner renew/release ok".into(),
    ))
}

/// Releasing twice reports "not held" the second time, and a stale lease
/// (from an earlier grant) never releases or renews the next holder's.
pub async fn stale_release_is_refused(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let key = h.key("stale");
    let first = take_free(&*a, &key, ttl).await?;
    ensure!(
        a.release(&first).await.map_err(fmt_err("release"))?,
        "first release said not held"
    );
    ensure!(
        !a.release(&first).await.map_err(fmt_err("second release"))?,
        "second release of the same lease said held"
    );
    let second = b
        .try_acquire(&key, ttl)
        .await
        .map_err(fmt_err("try_acquire by b"))?
        .ok_or("key still held after release")?;
    ensure!(
        !a.release(&first).await.map_err(fmt_err("stale release"))?,
        "a stale lease released the next holder's grant"
    );
    match a.renew(&first).await {
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        other => return Err(format!("stale renew: expected NotHeld, got {other:?}")),
    }
    ensure!(
        a.try_acquire(&key, ttl)
            .await
            .map_err(fmt_err("try_acquire"))?
            .is_none(),
        "the next holder lost the key to a stale release"
    );
    ensure!(
        b.release(&second).await.map_err(fmt_err("release b"))?,
        "b's release said not held"
    );
    Ok(Outcome::Passed("double and stale releases refused".into()))
}
