//! Cases on the API: deadlines, dropped acquires, bad input, inspect,
//! waiters served in order.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{ErrorKind, LockClient, MAX_TTL};
use tokio::time::{Instant, sleep, timeout};

use crate::harness::Harness;

use super::*;

/// Acquire with a wait deadline returns `Contended` within the deadline
/// plus the margin, and not much before it.
pub async fn acquire_times_out_at_deadline(h: &Harness) -> CaseResult {
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
pub async fn dropped_acquire_leaves_nothing(h: &Harness) -> CaseResult {
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
        // An acquire that completed before the cut is a grant like any
        // other (`expiry_frees_key` checks those): given back, so that what
        // is checked below is what the dropped ones left.
        if let Ok(Ok(lease)) = timeout(
            cut,
            b.acquire(&key, ttl, Instant::now() + Duration::from_secs(5)),
        )
        .await
        {
            b.release(&lease).await.map_err(fmt_err("release"))?;
        }
        keys.push(key);
    }
    keys.dedup();
    // Anything a dropped acquire left behind must be gone within its TTL
    // (at once where leases are per process: nothing may be left at all).
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
pub async fn bad_input_is_rejected(h: &Harness) -> CaseResult {
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
pub async fn inspect_reports_holder(h: &Harness) -> CaseResult {
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
pub async fn waiters_are_served_in_order(h: &Harness) -> CaseResult {
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
