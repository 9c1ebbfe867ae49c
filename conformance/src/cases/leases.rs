//! Cases on time: expiry frees the key, renewal extends it, a guard keeps
//! its lock past the TTL, the lost signal when the backend is unreachable.

use std::time::Duration;

use lock_core::{LockClient, LockGuard, LockState, TtlModel};
use tokio::time::{Instant, sleep, timeout};

use crate::harness::Harness;

use super::*;

/// A lease that is not renewed frees the key within TTL plus the margin,
/// never before its holder's validity deadline; releasing or renewing it
/// afterwards reports "not held" and leaves the new holder alone.
pub async fn expiry_frees_key(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    match caps.ttl_model {
        TtlModel::PerLease => {}
        TtlModel::PerSession => {
            return Ok(Outcome::Skipped(
                "TTL is per session: a lease expires only with its session (see the holder-killed scenario)".into(),
            ));
        }
        _ => {
            return Ok(Outcome::Skipped(
                "leases are per process: one ends when its holder process does (see the driver's killed-holder test)".into(),
            ));
        }
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
pub async fn renew_extends(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities());
    let key = h.key("renew");
    // b's connection is opened now, not inside the timed try at the end
    // (a loaded CI host once took more than the 1 s operation timeout for
    // that try on PostgreSQL, a new client's connect included).
    b.inspect(&key).await.map_err(fmt_err("inspect b"))?;
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

pub(super) async fn sleep_until_past(at: Instant) {
    tokio::time::sleep_until(at).await;
}

/// A renewing guard on `key` with `ttl`, from a client over `backend`.
async fn guard_on(
    backend: Arc<dyn LockBackend>,
    key: &LockKey,
    ttl: Duration,
) -> Result<LockGuard, String> {
    LockClient::from_arc(backend)
        .lock(key.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .map_err(fmt_err("acquire"))
}

/// The guard keeps a lock for more than 3x its TTL (3.5 TTLs) by renewing it.
pub async fn guard_keeps_lock_past_ttl(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities());
    let key = h.key("guard");
    let guard = guard_on(a, &key, ttl).await?;
    let hold = ttl * 3 + ttl / 2;
    let until = Instant::now() + hold;
    while Instant::now() < until {
        sleep(ttl / 2).await;
        ensure!(
            guard.state() == LockState::Held,
            "guard state {:?} while holding",
            guard.state()
        );
        let asked = Instant::now();
        let taken = b
            .try_acquire(&key, ttl)
            .await
            .map_err(fmt_err("try_acquire b"))?;
        if taken.is_some() {
            return Err(taken_from_guard(&guard, asked).await);
        }
    }
    ensure!(
        guard.release().await.map_err(fmt_err("release"))?,
        "release said not held"
    );
    Ok(Outcome::Passed(format!("held {hold:?} with TTL {ttl:?}")))
}

/// Why another client could take the key from a renewing guard: a double
/// holder (the guard still counted itself valid when the other grant was
/// asked for) or a lost lock (its renewals stopped landing within the TTL
/// and the guard's deadline passed first). Both fail the case; the message
/// says which, from the guard's own deadline and state.
async fn taken_from_guard(guard: &lock_core::LockGuard, asked: Instant) -> String {
    let deadline = guard.validity_deadline();
    if deadline > asked {
        return format!(
            "another client got the key while the guard held it (the guard's deadline was {:?} \
             after the other client asked)",
            deadline - asked
        );
    }
    let reason = timeout(Duration::from_millis(200), guard.lost())
        .await
        .unwrap_or_else(|_| format!("state {:?}", guard.state()));
    format!(
        "the guard lost the lock {:?} before another client asked for it (its renewals did not \
         land within the TTL): {reason}",
        asked - deadline
    )
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
pub async fn lost_signal_when_unreachable(h: &Harness) -> CaseResult {
    let result = lost_signal_inner(h).await;
    h.target()
        .heal()
        .await
        .map_err(|e| format!("heal failed: {e}"))?;
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
    result
}

pub(super) async fn lost_signal_inner(h: &Harness) -> CaseResult {
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
    // One grant and release first, so the client's connection is open
    // before the latency below: the timed grant then pays for its own
    // request, not for a connection handshake of several round trips (a
    // session-mode SQL client connects per held lock, and its handshake at
    // ttl / 10 a leg could outlast the operation timeout on a loaded host).
    let warm = h.key("lost-warm-up");
    if let Some(lease) = cut_client
        .try_acquire(&warm, ttl)
        .await
        .map_err(fmt_err("warm-up grant"))?
    {
        cut_client
            .release(&lease)
            .await
            .map_err(fmt_err("warm-up release"))?;
    }
    // A little latency on the holder's link: a client that dated its
    // deadline from the reply instead of the request would now promise
    // more than the server keeps.
    proxy.set_latency(ttl / 10, Duration::ZERO);
    let guard = guard_on(cut_client, &key, ttl).await?;
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
pub(super) async fn lost_signal_everyone_cut(h: &Harness) -> CaseResult {
    let a = h.client().await.map_err(fmt_err("client"))?;
    let ttl = h.ttl_for(&a.capabilities());
    let key = h.key("lost");
    let guard = guard_on(a, &key, ttl).await?;
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
