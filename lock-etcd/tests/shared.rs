//! Read-write locks and semaphores on a real etcd, what is etcd's own
//! beyond the conformance suite's shared cases (which `tests/etcd.rs` runs):
//! tokens as documented (the epoch's revision for readers), downgrade
//! refused on a deleted entry, the three shapes of one name apart, a
//! crashed or stalled holder's share freed by its session within its TTL,
//! a lease moved by its handle, contention through a leader's kill and
//! restart.
//!
//! A check is a function over any [`LockBackend`] and is also run on a
//! deliberately broken double ([`Broken`], wrapping the real backend with
//! one flaw) to show that it can fail.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::LockBackendExt;
use lock_core::{
    ErrorKind, FencingToken, Lease, LeaseKind, LockBackend, LockError, LockKey, LockShape, OwnerId,
};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

mod common;

const TTL: Duration = Duration::from_secs(2);
const PREFIX: &str = "shared";

type Check = Result<(), String>;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{}", &OwnerId::random().to_hex()[..8])).expect("key")
}

fn config(server: &EtcdServer, ttl: Duration) -> EtcdConfig {
    common::config_for(server, PREFIX, ttl)
}

async fn backend(server: &EtcdServer) -> Arc<EtcdBackend> {
    Arc::new(
        EtcdBackend::connect(config(server, TTL))
            .await
            .expect("connect"),
    )
}

fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).expect("permits")
}

fn ensure(ok: bool, what: impl Into<String>) -> Check {
    if ok { Ok(()) } else { Err(what.into()) }
}

fn err(e: LockError) -> String {
    e.to_string()
}

/// The raw entries under a shape's prefix (as the crate docs lay it out).
async fn raw_entries(raw: &EtcdBackend, key: &LockKey, tag: &str) -> usize {
    let prefix = format!("{PREFIX}/{}{tag}/", key.as_str());
    usize::try_from(common::raw_count(raw, prefix).await).expect("a count")
}

/// Waits (up to 3 s) until the shape's prefix holds `n` entries: a waiter
/// has queued.
async fn queued(raw: &EtcdBackend, key: &LockKey, tag: &str, n: usize) {
    let until = Instant::now() + Duration::from_secs(3);
    while raw_entries(raw, key, tag).await < n && Instant::now() < until {
        sleep(Duration::from_millis(10)).await;
    }
}

async fn try_kind(
    b: &dyn LockBackend,
    key: &LockKey,
    kind: LeaseKind,
) -> Result<Option<Lease>, String> {
    b.try_acquire_kind(key, kind, TTL).await.map_err(err)
}

/// `kind` on `key` at once, or `refused` as the failure.
async fn take(
    b: &dyn LockBackend,
    key: &LockKey,
    kind: LeaseKind,
    refused: &str,
) -> Result<Lease, String> {
    try_kind(b, key, kind)
        .await?
        .ok_or_else(|| refused.to_owned())
}

/// `kind` on `key` at once, for a test body: panics with `what` when
/// refused.
async fn granted(b: &dyn LockBackend, key: &LockKey, kind: LeaseKind, what: &str) -> Lease {
    b.try_acquire_kind(key, kind, TTL)
        .await
        .unwrap()
        .expect(what)
}

/// A task that waits (up to `within`, from when it starts) for `kind` on
/// `key`.
fn spawn_acquire(
    b: &Arc<dyn LockBackend>,
    key: &LockKey,
    kind: LeaseKind,
    within: Duration,
) -> JoinHandle<Result<Lease, LockError>> {
    let (b, key) = (b.clone(), key.clone());
    tokio::spawn(async move {
        b.acquire_kind(&key, kind, TTL, Instant::now() + within)
            .await
    })
}

// ---------------------------------------------------------------- checks

/// Tokens: 0 before any writer; writers strictly increasing above every
/// earlier grant; readers carry the last writer's token; permit grants
/// strictly increasing.
async fn check_tokens(b: Arc<dyn LockBackend>, raw: Arc<EtcdBackend>, key: LockKey) -> Check {
    let r0 = take(&*b, &key, LeaseKind::Read, "reader refused").await?;
    ensure(
        r0.token().get() == 0,
        format!("a reader before any writer has token {}", r0.token()),
    )?;
    b.release(&r0).await.map_err(err)?;
    let mut last_write = FencingToken::new(0);
    for _ in 0..3 {
        let w = take(&*b, &key, LeaseKind::Write, "writer refused").await?;
        ensure(
            w.token() > last_write,
            format!("write token {} after {last_write}", w.token()),
        )?;
        last_write = w.token();
        b.release(&w).await.map_err(err)?;
        let r1 = take(&*b, &key, LeaseKind::Read, "reader refused").await?;
        let r2 = take(&*b, &key, LeaseKind::Read, "reader refused").await?;
        for r in [&r1, &r2] {
            ensure(
                r.token() == last_write,
                format!(
                    "read token {} but the last write was {last_write}",
                    r.token()
                ),
            )?;
        }
        b.release(&r1).await.map_err(err)?;
        b.release(&r2).await.map_err(err)?;
    }
    // A writer that waited for readers: its token is above theirs.
    let r = take(&*b, &key, LeaseKind::Read, "reader refused").await?;
    let waiter = spawn_acquire(&b, &key, LeaseKind::Write, Duration::from_secs(5));
    queued(&raw, &key, "%rw", 2).await;
    b.release(&r).await.map_err(err)?;
    let w = waiter.await.map_err(|e| e.to_string())?.map_err(err)?;
    ensure(
        w.token() > last_write,
        "a waited-for writer's token did not increase",
    )?;
    b.release(&w).await.map_err(err)?;
    // Permits.
    let mut last = FencingToken::new(0);
    for _ in 0..3 {
        let p = take(&*b, &key, permits(1, 2), "permit refused").await?;
        ensure(
            p.token() > last,
            format!("permit token {} after {last}", p.token()),
        )?;
        last = p.token();
        b.release(&p).await.map_err(err)?;
    }
    Ok(())
}

/// A holder that crashes (its process gone, nothing released) frees its
/// share within its TTL: a writer waiting for a crashed reader, a permit
/// request waiting for crashed permits. `crash` takes the share and
/// crashes.
async fn check_crash_freed<F, Fut>(b: Arc<dyn LockBackend>, key: LockKey, crash: F) -> Check
where
    F: Fn(LockKey, LeaseKind) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let crash_ttl = Duration::from_secs(1);
    for (held, wanted) in [
        (LeaseKind::Read, LeaseKind::Write),
        (permits(2, 2), permits(1, 2)),
    ] {
        crash(key.clone(), held).await;
        let crashed_at = Instant::now();
        // Lease TTL (1 s) + etcd's expiry granularity and the watch.
        let lease = b
            .acquire_kind(
                &key,
                wanted,
                TTL,
                crashed_at + crash_ttl + Duration::from_millis(2500),
            )
            .await
            .map_err(|e| format!("{held} of a crashed holder not freed within its TTL: {e}"))?;
        println!(
            "{held} of a crashed holder freed after {:?}",
            crashed_at.elapsed()
        );
        b.release(&lease).await.map_err(err)?;
    }
    Ok(())
}

// The broken doubles and the tests that run the checks above on etcd and
// on each double.
#[path = "shared_cases/mod.rs"]
mod cases;
