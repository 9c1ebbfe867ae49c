//! The conformance cases: public async functions over a [`Harness`],
//! selected by capabilities, runnable from any driver's tests.
//!
//! Each returns an [`Outcome`]. Timing checks use the harness's margin for
//! lateness only; safety is judged from the recorded history, never from
//! wall-clock luck.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingScope, Lease, LockBackend, LockClient, LockKey, LockState, MAX_TTL, OwnerId,
    TtlModel,
};
use tokio::time::{Instant, sleep, timeout};

use crate::harness::Harness;
use crate::history::{FencedResource, History, Op, Recorder};

/// How a case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything held; the text has the figures.
    Passed(String),
    /// Not applicable to this backend (capabilities or target), with why.
    Skipped(String),
    /// A check failed, with what was seen.
    Failed(String),
}

impl Outcome {
    /// Whether it failed.
    pub fn is_failed(&self) -> bool {
        matches!(self, Self::Failed(_))
    }
}

type CaseResult = Result<Outcome, String>;

fn finish(result: CaseResult) -> Outcome {
    result.unwrap_or_else(Outcome::Failed)
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn fmt_err(what: &str) -> impl Fn(lock_core::LockError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

async fn clients(h: &Harness, n: usize) -> Result<Vec<Arc<dyn LockBackend>>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        out.push(h.client().await.map_err(fmt_err("connecting a client"))?);
    }
    Ok(out)
}

/// Two independent clients.
async fn two_clients(h: &Harness) -> Result<(Arc<dyn LockBackend>, Arc<dyn LockBackend>), String> {
    let mut both = clients(h, 2).await?.into_iter();
    match (both.next(), both.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err("could not make two clients".into()),
    }
}

/// Takes a key that must be free.
async fn take_free(
    backend: &dyn LockBackend,
    key: &LockKey,
    ttl: Duration,
) -> Result<Lease, String> {
    backend
        .try_acquire(key, ttl)
        .await
        .map_err(fmt_err("try_acquire"))?
        .ok_or_else(|| format!("the free key {key} was reported held"))
}

/// Acquires waiting until `deadline`, recording invoke/ok/fail.
pub(crate) async fn recorded_acquire(
    backend: &dyn LockBackend,
    rec: &Recorder,
    key: &LockKey,
    ttl: Duration,
    deadline: Instant,
) -> Result<Lease, lock_core::LockError> {
    rec.invoke(Op::Acquire, key, None);
    match backend.acquire(key, ttl, deadline).await {
        Ok(lease) => {
            rec.acquired(key, lease.token(), lease.validity_deadline());
            Ok(lease)
        }
        Err(e) => {
            rec.failed(Op::Acquire, key, None);
            Err(e)
        }
    }
}

async fn recorded_release(
    backend: &dyn LockBackend,
    rec: &Recorder,
    lease: &Lease,
) -> Result<bool, lock_core::LockError> {
    rec.invoke(Op::Release, lease.key(), Some(lease.token()));
    let held = backend.release(lease).await?;
    rec.released(lease.key(), lease.token(), held);
    Ok(held)
}

/// N tasks x M iterations on one key over several clients: a shared
/// "currently inside" counter must never exceed 1, a read-sleep-write
/// counter must lose no increment, and the history checker must find no
/// overlapping promised windows.
pub async fn mutual_exclusion(h: &Harness) -> Outcome {
    finish(mutual_exclusion_inner(h).await)
}

async fn mutual_exclusion_inner(h: &Harness) -> CaseResult {
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
                let lease = recorded_acquire(
                    &*backend,
                    &rec,
                    &key,
                    ttl,
                    Instant::now() + Duration::from_secs(60),
                )
                .await?;
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now_inside, Ordering::SeqCst);
                let read = *counter.lock().expect("counter");
                tokio::task::yield_now().await;
                sleep(Duration::from_micros(200)).await;
                *counter.lock().expect("counter") = read + 1;
                inside.fetch_sub(1, Ordering::SeqCst);
                if !recorded_release(&*backend, &rec, &lease).await? {
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

/// At least `fencing_grants` contended grants of one key: tokens strictly
/// increase in grant order, and a fenced resource rejects nothing.
pub async fn fencing_tokens_increase(h: &Harness) -> Outcome {
    finish(fencing_inner(h).await)
}

async fn fencing_inner(h: &Harness) -> CaseResult {
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
                let lease = recorded_acquire(
                    &*backend,
                    &rec,
                    &key,
                    ttl,
                    Instant::now() + Duration::from_secs(60),
                )
                .await?;
                if !resource.write(&rec, &key, lease.token(), |v| *v += 1) {
                    rejected += 1;
                }
                // Hold across a scheduling point so the other tasks really
                // contend (with a fast backend they would otherwise rarely
                // see the key held).
                tokio::task::yield_now().await;
                recorded_release(&*backend, &rec, &lease).await?;
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
pub async fn only_owner_can_release_or_renew(h: &Harness) -> Outcome {
    finish(only_owner_inner(h).await)
}

async fn only_owner_inner(h: &Harness) -> CaseResult {
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
pub async fn stale_release_is_refused(h: &Harness) -> Outcome {
    finish(stale_release_inner(h).await)
}

async fn stale_release_inner(h: &Harness) -> CaseResult {
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

/// A lease that is not renewed frees the key within TTL plus the margin,
/// never before its holder's validity deadline; releasing or renewing it
/// afterwards reports "not held" and leaves the new holder alone.
pub async fn expiry_frees_key(h: &Harness) -> Outcome {
    finish(expiry_inner(h).await)
}

async fn expiry_inner(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    if caps.ttl_model == TtlModel::PerSession {
        return Ok(Outcome::Skipped(
            "TTL is per session: a lease expires only with its session (see the holder-killed scenario)".into(),
        ));
    }
    let ttl = h.ttl_for(&caps);
    let margin = h.config().margin;
    let key = h.key("expiry");
    let started = Instant::now();
    let lease = take_free(&*a, &key, ttl).await?;
    let next = b
        .acquire(&key, ttl, started + ttl + margin)
        .await
        .map_err(fmt_err("acquire after expiry"))?;
    let got_at = Instant::now();
    ensure!(
        got_at >= lease.validity_deadline(),
        "granted to b {:?} before a's validity deadline",
        lease.validity_deadline() - got_at
    );
    ensure!(
        !a.release(&lease)
            .await
            .map_err(fmt_err("release after expiry"))?,
        "release after expiry said held"
    );
    ensure!(
        a.renew(&lease).await.is_err(),
        "renew after expiry succeeded"
    );
    let info = b.inspect(&key).await.map_err(fmt_err("inspect"))?;
    ensure!(
        info.is_some(),
        "the new holder's lock was deleted by a stale release"
    );
    ensure!(
        b.release(&next).await.map_err(fmt_err("release b"))?,
        "b's release said not held"
    );
    Ok(Outcome::Passed(format!(
        "freed {:?} after grant (TTL {ttl:?})",
        got_at - started
    )))
}

/// Renewing extends a lease past its original expiry.
pub async fn renew_extends(h: &Harness) -> Outcome {
    finish(renew_inner(h).await)
}

async fn renew_inner(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities());
    let key = h.key("renew");
    let mut lease = take_free(&*a, &key, ttl).await?;
    let first_deadline = lease.validity_deadline();
    sleep(ttl / 2).await;
    let deadline = a.renew(&lease).await.map_err(fmt_err("renew"))?;
    ensure!(deadline > first_deadline, "renew did not move the deadline");
    lease.set_validity_deadline(deadline);
    sleep_until_past(first_deadline + ttl / 5).await;
    ensure!(
        b.try_acquire(&key, ttl)
            .await
            .map_err(fmt_err("try_acquire b"))?
            .is_none(),
        "the key was free after a renewal, past the original expiry"
    );
    ensure!(
        a.release(&lease).await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    Ok(Outcome::Passed(
        "renewed lease outlived its first TTL".into(),
    ))
}

async fn sleep_until_past(at: Instant) {
    tokio::time::sleep_until(at).await;
}

/// The guard keeps a lock for more than 5x its TTL by renewing it.
pub async fn guard_keeps_lock_past_ttl(h: &Harness) -> Outcome {
    finish(guard_inner(h).await)
}

async fn guard_inner(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities());
    let key = h.key("guard");
    let client = LockClient::from_arc(a);
    let guard = client
        .lock(key.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .map_err(fmt_err("acquire"))?;
    let hold = ttl * 5 + ttl / 2;
    let until = Instant::now() + hold;
    while Instant::now() < until {
        sleep(ttl / 2).await;
        ensure!(
            guard.state() == LockState::Held,
            "guard state {:?} while holding",
            guard.state()
        );
        ensure!(
            b.try_acquire(&key, ttl)
                .await
                .map_err(fmt_err("try_acquire b"))?
                .is_none(),
            "another client got the key while the guard held it"
        );
    }
    ensure!(
        guard.release().await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    Ok(Outcome::Passed(format!("held {hold:?} with TTL {ttl:?}")))
}

/// When the holder is cut off from the backend, the guard reports `Lost`
/// before the **server** frees the key, and `run` cancels the protected
/// work. The holder is cut through a fault proxy while a second, directly
/// connected client probes for the key every few milliseconds; the margin
/// (the moment the probe got the key minus the moment of the lost signal)
/// must be positive. Targets without a proxy cut every client
/// ([`Target::make_unreachable`](crate::Target::make_unreachable)); the
/// server's free time cannot be observed then, and the lost signal is held
/// to the guard's validity deadline instead.
pub async fn lost_signal_when_unreachable(h: &Harness) -> Outcome {
    let result = lost_signal_inner(h).await;
    if let Err(e) = h.target().heal().await {
        return Outcome::Failed(format!("heal failed: {e}"));
    }
    // Let the backend settle before the next case.
    if let Ok(client) = h.client().await {
        let key = h.key("settle");
        let _ = client
            .acquire(
                &key,
                h.config().ttl,
                Instant::now() + Duration::from_secs(30),
            )
            .await;
    }
    finish(result)
}

async fn lost_signal_inner(h: &Harness) -> CaseResult {
    let proxied = h
        .target()
        .proxied_client()
        .await
        .map_err(|e| format!("proxied client: {e}"))?;
    let Some((cut_client, proxy)) = proxied else {
        return lost_signal_everyone_cut(h).await;
    };
    let probe = h.client().await.map_err(fmt_err("client"))?;
    let caps = probe.capabilities();
    let ttl = h.ttl_for(&caps);
    let margin = h.config().margin;
    let key = h.key("lost");
    // A little latency on the holder's link: a client that dated its
    // deadline from the reply instead of the request would now promise
    // more than the server keeps.
    proxy.set_latency(ttl / 10, Duration::ZERO);
    let guard = LockClient::from_arc(cut_client)
        .lock(key.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .map_err(fmt_err("acquire"))?;
    // Let one renewal happen first, so the case covers a renewed lease.
    sleep(ttl / 2).await;
    proxy.partition();
    let cut_at = Instant::now();
    let free_within = match caps.ttl_model {
        TtlModel::PerLease => ttl * 3 + margin * 2,
        _ => Duration::from_secs(30),
    };
    let work = guard.run(async {
        sleep(ttl * 10).await;
    });
    let lost = async {
        let result = timeout(ttl * 3 + margin * 2, work).await;
        (result, Instant::now())
    };
    let freed = async {
        let until = cut_at + free_within;
        while Instant::now() < until {
            if let Ok(Some(lease)) = probe.try_acquire(&key, ttl).await {
                let at = Instant::now();
                let _ = probe.release(&lease).await;
                return Some(at);
            }
            sleep(Duration::from_millis(2)).await;
        }
        None
    };
    let ((result, lost_at), freed_at) = tokio::join!(lost, freed);
    proxy.heal();
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    match result {
        Err(_) => return Err("the guard never reported the lock lost".into()),
        Ok(Ok(())) => {
            return Err("protected work ran to completion after the holder was cut off".into());
        }
        Ok(Err(e)) => ensure!(e.is_lost(), "run returned {e}, expected a lost-lease error"),
    }
    ensure!(
        matches!(guard.state(), LockState::Lost(_)),
        "state is {:?} after run was cancelled",
        guard.state()
    );
    let freed_at = freed_at.ok_or_else(|| {
        format!("the server never freed the cut-off holder's key within {free_within:?}")
    })?;
    ensure!(
        lost_at < freed_at,
        "the server freed the key {:?} BEFORE the holder was told it lost it",
        lost_at - freed_at
    );
    Ok(Outcome::Passed(format!(
        "lost {:?} after the cut; the server freed the key {:?} later (margin)",
        lost_at - cut_at,
        freed_at - lost_at
    )))
}

/// The fallback without a proxy: every client is cut, so only the guard's
/// own deadline can be checked.
async fn lost_signal_everyone_cut(h: &Harness) -> CaseResult {
    let a = h.client().await.map_err(fmt_err("client"))?;
    let ttl = h.ttl_for(&a.capabilities());
    let key = h.key("lost");
    let client = LockClient::from_arc(a);
    let guard = client
        .lock(key.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .map_err(fmt_err("acquire"))?;
    sleep(ttl / 2).await;
    match h.target().make_unreachable().await {
        Ok(true) => {}
        Ok(false) => {
            return Ok(Outcome::Skipped(
                "target can neither cut one client nor make the backend unreachable".into(),
            ));
        }
        Err(e) => return Err(format!("make_unreachable: {e}")),
    }
    let cut_at = Instant::now();
    let deadline = guard.validity_deadline();
    let margin = h.config().margin;
    let work = guard.run(async {
        sleep(ttl * 10).await;
    });
    let result = timeout(ttl * 3 + margin * 2, work).await;
    let lost_at = Instant::now();
    match result {
        Err(_) => return Err("the guard never reported the lock lost".into()),
        Ok(Ok(())) => {
            return Err(
                "protected work ran to completion after the backend became unreachable".into(),
            );
        }
        Ok(Err(e)) => ensure!(e.is_lost(), "run returned {e}, expected a lost-lease error"),
    }
    let final_deadline = guard.validity_deadline().max(deadline);
    ensure!(
        lost_at <= final_deadline + margin,
        "lost signal came {:?} after the validity deadline",
        lost_at - final_deadline
    );
    Ok(Outcome::Passed(format!(
        "lost {:?} after the cut, {:?} before the deadline (no proxy: server free time not observed)",
        lost_at - cut_at,
        final_deadline.saturating_duration_since(lost_at)
    )))
}

/// Acquire with a wait deadline returns `Contended` within the deadline
/// plus the margin, and not much before it.
pub async fn acquire_times_out_at_deadline(h: &Harness) -> Outcome {
    finish(deadline_inner(h).await)
}

async fn deadline_inner(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(10));
    let key = h.key("deadline");
    let lease = take_free(&*a, &key, ttl).await?;
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let result = b.acquire(&key, ttl, started + wait).await;
    let elapsed = started.elapsed();
    match result {
        Err(e) if e.kind() == ErrorKind::Contended => {}
        Err(e) => return Err(format!("expected Contended, got {e}")),
        Ok(_) => return Err("acquired a key that was held".into()),
    }
    ensure!(
        elapsed + Duration::from_millis(20) >= wait,
        "gave up after {elapsed:?}, before the {wait:?} deadline"
    );
    ensure!(
        elapsed <= wait + h.config().margin,
        "gave up after {elapsed:?}, deadline was {wait:?}"
    );
    ensure!(
        a.release(&lease).await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    // The timed-out waiter left nothing behind: the key is free now.
    let free = b
        .acquire(&key, ttl, Instant::now() + h.config().margin)
        .await
        .map_err(fmt_err("acquire after the holder released"))?;
    b.release(&free).await.map_err(fmt_err("release"))?;
    Ok(Outcome::Passed(format!(
        "Contended after {elapsed:?} (deadline {wait:?})"
    )))
}

/// Dropping acquire futures (waiting, and at random points of a free-key
/// acquire) leaves no lock held past its TTL.
pub async fn dropped_acquire_leaves_nothing(h: &Harness) -> Outcome {
    finish(dropped_inner(h).await)
}

async fn dropped_inner(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities());
    let margin = h.config().margin;
    let key = h.key("dropped");
    // 1. A waiter dropped while the key is held.
    let lease = take_free(&*a, &key, ttl * 10).await?;
    let waiting = b.acquire(&key, ttl, Instant::now() + Duration::from_secs(30));
    ensure!(
        timeout(Duration::from_millis(200), waiting).await.is_err(),
        "a waiter got a held key"
    );
    ensure!(
        a.release(&lease).await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    let started = Instant::now();
    let next = a
        .acquire(&key, ttl, started + ttl + margin)
        .await
        .map_err(|e| format!("the dropped waiter kept the key past its TTL: {e}"))?;
    let freed_after = started.elapsed();
    a.release(&next).await.map_err(fmt_err("release"))?;

    // 2. Acquires on free keys dropped at varied points.
    let rounds = 50u32;
    let mut keys = Vec::new();
    for i in 0..rounds {
        let key = h.key(&format!("dropped-{}", i % 5));
        let cut = Duration::from_micros(u64::from(i) * 150);
        let _ = timeout(
            cut,
            b.acquire(&key, ttl, Instant::now() + Duration::from_secs(5)),
        )
        .await;
        keys.push(key);
    }
    keys.dedup();
    // Anything a dropped acquire left behind must be gone within its TTL.
    let check_by = Instant::now() + ttl + margin;
    for key in keys.iter().take(5) {
        let lease = a
            .acquire(key, ttl, check_by)
            .await
            .map_err(|e| format!("{key} still held past its TTL after dropped acquires: {e}"))?;
        a.release(&lease).await.map_err(fmt_err("release"))?;
    }
    Ok(Outcome::Passed(format!(
        "dropped waiter: key free {freed_after:?} after release; {rounds} dropped acquires left nothing"
    )))
}

/// Bad keys, TTLs and options give typed `InvalidArgument` errors, send
/// nothing, and leave no lock behind.
pub async fn bad_input_is_rejected(h: &Harness) -> Outcome {
    finish(bad_input_inner(h).await)
}

async fn bad_input_inner(h: &Harness) -> CaseResult {
    let a = h.client().await.map_err(fmt_err("client"))?;
    let caps = a.capabilities();
    let key = h.key("bad-input");
    let mut bad_ttls = vec![Duration::ZERO, MAX_TTL + Duration::from_secs(1)];
    if caps.min_ttl > Duration::from_millis(1) {
        bad_ttls.push(caps.min_ttl / 2);
    }
    for ttl in bad_ttls {
        match a.try_acquire(&key, ttl).await {
            Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
            other => {
                return Err(format!(
                    "try_acquire with TTL {ttl:?}: expected InvalidArgument, got {other:?}"
                ));
            }
        }
        match a
            .acquire(&key, ttl, Instant::now() + Duration::from_millis(100))
            .await
        {
            Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
            other => {
                return Err(format!(
                    "acquire with TTL {ttl:?}: expected InvalidArgument, got {other:?}"
                ));
            }
        }
    }
    let client = LockClient::from_arc(a.clone());
    for name in [
        "",
        "nul\0byte",
        "line\nbreak",
        &"k".repeat(lock_core::MAX_KEY_LEN + 1),
    ] {
        match client.lock(name).acquire().await {
            Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
            other => {
                return Err(format!(
                    "key {name:?}: expected InvalidArgument, got {other:?}"
                ));
            }
        }
    }
    let info = a.inspect(&key).await.map_err(fmt_err("inspect"))?;
    ensure!(
        info.is_none(),
        "rejected requests left a lock behind: {info:?}"
    );
    Ok(Outcome::Passed(
        "bad TTLs and keys rejected with InvalidArgument".into(),
    ))
}

/// `inspect` reports the holder, its token and a remaining TTL no larger
/// than the TTL; nothing once released.
pub async fn inspect_reports_holder(h: &Harness) -> Outcome {
    finish(inspect_inner(h).await)
}

async fn inspect_inner(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("inspect");
    ensure!(
        b.inspect(&key).await.map_err(fmt_err("inspect"))?.is_none(),
        "a fresh key is reported held"
    );
    let lease = take_free(&*a, &key, ttl).await?;
    let info = b
        .inspect(&key)
        .await
        .map_err(fmt_err("inspect"))?
        .ok_or("inspect reports a held key as free")?;
    ensure!(info.key == key, "inspect reports key {:?}", info.key);
    ensure!(!info.holder.is_empty(), "inspect reports an empty holder");
    if caps.has_fencing() {
        ensure!(
            info.token == Some(lease.token()),
            "inspect token {:?}, lease token {}",
            info.token,
            lease.token()
        );
    }
    if let Some(left) = info.remaining_ttl {
        ensure!(
            left <= ttl + Duration::from_millis(5),
            "remaining TTL {left:?} exceeds TTL {ttl:?}"
        );
    }
    a.release(&lease).await.map_err(fmt_err("release"))?;
    ensure!(
        b.inspect(&key).await.map_err(fmt_err("inspect"))?.is_none(),
        "released key still reported held"
    );
    Ok(Outcome::Passed(format!(
        "holder {} token {:?} ttl left {:?}",
        info.holder, info.token, info.remaining_ttl
    )))
}

/// Waiters are granted in arrival order (FIFO backends only).
pub async fn waiters_are_served_in_order(h: &Harness) -> Outcome {
    finish(fifo_inner(h).await)
}

async fn fifo_inner(h: &Harness) -> CaseResult {
    let clients = clients(h, 4).await?;
    let caps = clients[0].capabilities();
    if !caps.fifo {
        return Ok(Outcome::Skipped(
            "backend does not promise FIFO waiting".into(),
        ));
    }
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("fifo");
    let holder = take_free(&*clients[0], &key, ttl).await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, backend) in clients.iter().enumerate().skip(1) {
        let (backend, key, order) = (backend.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = backend
                .acquire(&key, ttl, Instant::now() + Duration::from_secs(30))
                .await?;
            order.lock().expect("order").push(i);
            sleep(Duration::from_millis(10)).await;
            backend.release(&lease).await
        }));
        // Space the arrivals so their order is unambiguous.
        sleep(Duration::from_millis(150)).await;
    }
    clients[0]
        .release(&holder)
        .await
        .map_err(fmt_err("release"))?;
    for task in tasks {
        task.await
            .map_err(|e| format!("task panicked: {e}"))?
            .map_err(fmt_err("waiter"))?;
    }
    let order = order.lock().expect("order").clone();
    ensure!(
        order == vec![1, 2, 3],
        "waiters granted in order {order:?}, expected [1, 2, 3]"
    );
    Ok(Outcome::Passed("3 waiters granted in arrival order".into()))
}
