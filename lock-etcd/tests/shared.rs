//! Read-write locks and semaphores on a real etcd: readers overlap, a
//! writer excludes everyone (also under contention), a waiting writer keeps
//! later readers out, downgrade leaves no gap, semaphore limits hold and
//! mismatches are refused, tokens as documented, a crashed holder's share
//! comes back within its TTL, a cancelled waiter leaves nothing.
//!
//! Each check is a function over any [`LockBackend`] and is also run on a
//! deliberately broken double ([`Broken`], wrapping the real backend with
//! one flaw) to show that it can fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::etcd::EtcdServer;
use lock_core::LockBackendExt;
use lock_core::{
    ErrorKind, FencingToken, Lease, LeaseKind, LockBackend, LockError, LockKey, LockShape, OwnerId,
};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

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

/// `kind` on `key`, waiting up to `within`.
async fn wait_kind(
    b: &dyn LockBackend,
    key: &LockKey,
    kind: LeaseKind,
    within: Duration,
) -> Result<Lease, String> {
    b.acquire_kind(key, kind, TTL, Instant::now() + within)
        .await
        .map_err(err)
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

/// The lease `task` returns within `within`, or `late` as the failure.
async fn joined(
    task: JoinHandle<Result<Lease, LockError>>,
    within: Duration,
    late: &str,
) -> Result<Lease, String> {
    timeout(within, task)
        .await
        .map_err(|_| late.to_owned())?
        .map_err(|e| e.to_string())?
        .map_err(err)
}

/// Waits for every task: the first failure (the task's own, or its panic)
/// is the check's.
async fn join_all(tasks: Vec<JoinHandle<Check>>) -> Check {
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Five tries for `kind` on `key` over 100 ms (a waiter queued ahead must
/// keep them all out): the first grant, if any.
async fn five_tries(
    b: &dyn LockBackend,
    key: &LockKey,
    kind: LeaseKind,
) -> Result<Option<Lease>, String> {
    for _ in 0..5 {
        if let Some(lease) = try_kind(b, key, kind).await? {
            return Ok(Some(lease));
        }
        sleep(Duration::from_millis(25)).await;
    }
    Ok(None)
}

/// `tasks` tasks each take `kind(t)` on `key` `rounds` times (waiting up
/// to `within`) and hold it for `hold`: the most held at once, observed (a
/// grant of n permits counts n, any other grant 1).
async fn most_held_at_once(
    b: &Arc<dyn LockBackend>,
    key: &LockKey,
    (tasks, rounds): (u32, u32),
    (within, hold): (Duration, Duration),
    kind: impl Fn(u32) -> LeaseKind,
) -> Result<i64, String> {
    let active = Arc::new(AtomicI64::new(0));
    let max = Arc::new(AtomicI64::new(0));
    let mut running = Vec::new();
    for t in 0..tasks {
        let (b, key, active, max) = (b.clone(), key.clone(), active.clone(), max.clone());
        let kind = kind(t);
        let weight = match kind {
            LeaseKind::Permits { count, .. } => i64::from(count),
            _ => 1,
        };
        running.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let lease = wait_kind(&*b, &key, kind, within).await?;
                let now = active.fetch_add(weight, Ordering::SeqCst) + weight;
                max.fetch_max(now, Ordering::SeqCst);
                sleep(hold).await;
                active.fetch_sub(weight, Ordering::SeqCst);
                b.release(&lease).await.map_err(err)?;
            }
            Ok(())
        }));
    }
    join_all(running).await?;
    Ok(max.load(Ordering::SeqCst))
}

// ---------------------------------------------------------------- checks

/// Two readers hold at once (and so do four tasks, observed), with equal
/// tokens, and both appear in `holders`.
async fn check_readers_overlap(b: Arc<dyn LockBackend>, key: LockKey) -> Check {
    let r1 = take(&*b, &key, LeaseKind::Read, "first reader refused").await?;
    let r2 = take(
        &*b,
        &key,
        LeaseKind::Read,
        "a second reader was refused beside a reader",
    )
    .await?;
    ensure(
        r1.token() == r2.token(),
        "readers of one epoch carry different tokens",
    )?;
    let holders = b.holders(&key, LockShape::ReadWrite).await.map_err(err)?;
    ensure(
        holders.iter().filter(|h| h.kind == LeaseKind::Read).count() == 2,
        format!("holders should list 2 readers: {holders:?}"),
    )?;
    b.release(&r1).await.map_err(err)?;
    b.release(&r2).await.map_err(err)?;
    // Observed: four tasks each hold a read lock for 300 ms.
    let max = most_held_at_once(
        &b,
        &key,
        (4, 1),
        (Duration::from_secs(3), Duration::from_millis(300)),
        |_| LeaseKind::Read,
    )
    .await?;
    ensure(
        max >= 2,
        format!("readers never overlapped (max {max} at once)"),
    )
}

/// A writer is refused beside a reader and beside a writer, a reader beside
/// a writer; under contention no writer ever holds beside anyone.
async fn check_writer_excluded(b: Arc<dyn LockBackend>, key: LockKey) -> Check {
    let r = take(&*b, &key, LeaseKind::Read, "reader refused").await?;
    if let Some(w) = try_kind(&*b, &key, LeaseKind::Write).await? {
        b.release(&w).await.map_err(err)?;
        b.release(&r).await.map_err(err)?;
        return Err("a writer was granted beside a reader".into());
    }
    b.release(&r).await.map_err(err)?;
    let w = take(&*b, &key, LeaseKind::Write, "writer refused on a free key").await?;
    for kind in [LeaseKind::Read, LeaseKind::Write] {
        if let Some(other) = try_kind(&*b, &key, kind).await? {
            b.release(&other).await.map_err(err)?;
            b.release(&w).await.map_err(err)?;
            return Err(format!("a {kind} grant beside a writer"));
        }
    }
    b.release(&w).await.map_err(err)?;
    // Contention: 6 tasks, 2 of them writers, 8 grants each.
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let violations = Arc::new(AtomicU32::new(0));
    let overlapped = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..6 {
        let (b, key) = (b.clone(), key.clone());
        let (readers, writers, violations, overlapped) = (
            readers.clone(),
            writers.clone(),
            violations.clone(),
            overlapped.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let kind = if t < 2 {
                LeaseKind::Write
            } else {
                LeaseKind::Read
            };
            for _ in 0..8 {
                let lease = wait_kind(&*b, &key, kind, Duration::from_secs(10)).await?;
                if kind == LeaseKind::Write {
                    let w = writers.fetch_add(1, Ordering::SeqCst) + 1;
                    if w > 1 || readers.load(Ordering::SeqCst) > 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    sleep(Duration::from_millis(10)).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                } else {
                    let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    if r > 1 {
                        overlapped.fetch_add(1, Ordering::SeqCst);
                    }
                    if writers.load(Ordering::SeqCst) > 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    sleep(Duration::from_millis(10)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                }
                b.release(&lease).await.map_err(err)?;
            }
            Ok::<(), String>(())
        }));
    }
    join_all(tasks).await?;
    let v = violations.load(Ordering::SeqCst);
    ensure(
        v == 0,
        format!("{v} grants overlapped a writer under contention"),
    )?;
    println!(
        "contention: readers overlapped {} times",
        overlapped.load(Ordering::SeqCst)
    );
    Ok(())
}

/// A waiting writer keeps later readers out (try and wait), and gets the
/// lock as soon as the earlier reader goes.
async fn check_writer_preference(
    b: Arc<dyn LockBackend>,
    raw: Arc<EtcdBackend>,
    key: LockKey,
) -> Check {
    let r1 = take(&*b, &key, LeaseKind::Read, "reader refused").await?;
    let writer = spawn_acquire(&b, &key, LeaseKind::Write, Duration::from_secs(5));
    queued(&raw, &key, "%rw", 2).await;
    // Five tries over 100 ms, then a wait: all must queue behind the writer.
    let late = five_tries(&*b, &key, LeaseKind::Read).await?;
    let waited = b
        .acquire_kind(
            &key,
            LeaseKind::Read,
            TTL,
            Instant::now() + Duration::from_millis(300),
        )
        .await;
    let mut failure = None;
    if let Some(late) = late {
        b.release(&late).await.map_err(err)?;
        failure = Some("a new reader got in while a writer waited".to_owned());
    }
    match waited {
        Ok(lease) => {
            b.release(&lease).await.map_err(err)?;
            failure.get_or_insert("a waiting reader got in while a writer waited".to_owned());
        }
        Err(e) if e.kind() == ErrorKind::Contended => {}
        Err(e) => return Err(format!("waiting reader: {e}")),
    }
    let released_at = Instant::now();
    b.release(&r1).await.map_err(err)?;
    let w = joined(
        writer,
        Duration::from_secs(3),
        "the writer was not granted after the reader left",
    )
    .await?;
    let took = released_at.elapsed();
    b.release(&w).await.map_err(err)?;
    if let Some(failure) = failure {
        return Err(failure);
    }
    ensure(
        took < Duration::from_secs(1),
        format!("the writer took {took:?} after the reader left"),
    )
}

/// Downgrade: the read lease keeps the token, a writer that waited before
/// stays out until the reader goes, the write lease is dead afterwards.
async fn check_downgrade(b: Arc<dyn LockBackend>, raw: Arc<EtcdBackend>, key: LockKey) -> Check {
    let w = take(&*b, &key, LeaseKind::Write, "writer refused").await?;
    let second = spawn_acquire(&b, &key, LeaseKind::Write, Duration::from_secs(6));
    queued(&raw, &key, "%rw", 2).await;
    let read = b.downgrade(&w).await.map_err(err)?;
    ensure(
        read.kind() == LeaseKind::Read,
        "downgrade did not return a read lease",
    )?;
    ensure(
        read.token() == w.token(),
        "the downgraded lease changed its token",
    )?;
    sleep(Duration::from_millis(300)).await;
    if second.is_finished() {
        return Err("another writer got in at the downgrade".into());
    }
    match b.renew(&w).await {
        Err(e) if e.kind() == ErrorKind::NotHeld => {}
        other => return Err(format!("renewing the old write lease: {other:?}")),
    }
    ensure(
        !b.release(&w).await.map_err(err)?,
        "the old write lease was released",
    )?;
    b.renew(&read).await.map_err(err)?;
    let holders = b.holders(&key, LockShape::ReadWrite).await.map_err(err)?;
    ensure(
        holders.len() == 1
            && holders[0].kind == LeaseKind::Read
            && holders[0].token == Some(w.token()),
        format!("holders after downgrade: {holders:?}"),
    )?;
    ensure(
        b.release(&read).await.map_err(err)?,
        "the read lease was not released",
    )?;
    let next = joined(
        second,
        Duration::from_secs(3),
        "the waiting writer did not get the lock",
    )
    .await?;
    ensure(
        next.token() > w.token(),
        "the next writer's token did not increase",
    )?;
    b.release(&next).await.map_err(err)?;
    Ok(())
}

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

/// Never more than the limit, taken atomically, observed under contention;
/// a big request at the head is not starved by small later ones.
async fn check_semaphore_limit(
    b: Arc<dyn LockBackend>,
    raw: Arc<EtcdBackend>,
    key: LockKey,
) -> Check {
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(take(&*b, &key, permits(1, 3), "permit refused below the limit").await?);
    }
    let extra = try_kind(&*b, &key, permits(1, 3)).await?;
    let holders = b.holders(&key, LockShape::Semaphore).await.map_err(err)?;
    for lease in held.drain(..) {
        b.release(&lease).await.map_err(err)?;
    }
    if let Some(extra) = extra {
        b.release(&extra).await.map_err(err)?;
        return Err("a 4th permit of 3 was granted".into());
    }
    ensure(
        holders.len() == 3,
        format!("holders of 3 permits: {holders:?}"),
    )?;
    // FIFO: 2 held, a request for 3 waits, a later request for 1 (which
    // would fit) queues behind it.
    let two = take(&*b, &key, permits(2, 3), "2 permits refused").await?;
    let big = spawn_acquire(&b, &key, permits(3, 3), Duration::from_secs(5));
    queued(&raw, &key, "%sem", 2).await;
    // Five tries over 100 ms: all must queue behind the big one.
    let small = five_tries(&*b, &key, permits(1, 3)).await?;
    if let Some(small) = small {
        b.release(&small).await.map_err(err)?;
        b.release(&two).await.map_err(err)?;
        let _ = big.await;
        return Err("a small request overtook a waiting big one".into());
    }
    b.release(&two).await.map_err(err)?;
    let big = joined(
        big,
        Duration::from_secs(3),
        "the big request was not granted",
    )
    .await?;
    b.release(&big).await.map_err(err)?;
    // Contention: 6 tasks take 1 or 2 of 3 permits.
    let max = most_held_at_once(
        &b,
        &key,
        (6, 6),
        (Duration::from_secs(10), Duration::from_millis(10)),
        |t| permits(1 + t % 2, 3),
    )
    .await?;
    ensure(
        max <= 3,
        format!("{max} permits of 3 held at once under contention"),
    )?;
    println!("contention: at most {max} of 3 permits held at once");
    Ok(())
}

/// A limit that differs from the holders' is InvalidArgument and leaves no
/// entry behind; bad counts are InvalidArgument; an idle semaphore takes a
/// new limit.
async fn check_limit_mismatch(
    b: Arc<dyn LockBackend>,
    raw: Arc<EtcdBackend>,
    key: LockKey,
) -> Check {
    let held = take(&*b, &key, permits(1, 3), "permit refused").await?;
    let mut failure = None;
    match b.try_acquire_kind(&key, permits(1, 4), TTL).await {
        Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
        Ok(Some(lease)) => {
            b.release(&lease).await.map_err(err)?;
            failure = Some("a request with another limit was granted".to_owned());
        }
        other => failure = Some(format!("try with another limit: {other:?}")),
    }
    match b
        .acquire_kind(
            &key,
            permits(1, 4),
            TTL,
            Instant::now() + Duration::from_secs(1),
        )
        .await
    {
        Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
        Ok(lease) => {
            b.release(&lease).await.map_err(err)?;
            failure.get_or_insert("a waiting request with another limit was granted".to_owned());
        }
        Err(e) => {
            failure.get_or_insert(format!("wait with another limit: {e}"));
        }
    }
    let left = raw_entries(&raw, &key, "%sem").await;
    b.release(&held).await.map_err(err)?;
    if let Some(failure) = failure {
        return Err(failure);
    }
    ensure(
        left == 1,
        format!("{left} entries after the refused requests (1 held)"),
    )?;
    for (count, limit) in [(0, 3), (4, 3), (1, 0)] {
        let kind = LeaseKind::Permits { count, limit };
        match b.try_acquire_kind(&key, kind, TTL).await {
            Err(e) if e.kind() == ErrorKind::InvalidArgument => {}
            other => return Err(format!("{count} of {limit} permits: {other:?}")),
        }
    }
    let idle = take(
        &*b,
        &key,
        permits(1, 4),
        "an idle semaphore refused a new limit",
    )
    .await?;
    b.release(&idle).await.map_err(err)?;
    Ok(())
}

/// A waiter that is cancelled leaves nothing: the reader behind the
/// cancelled writer gets in at once, the semaphore's entries are back.
async fn check_cancel(b: Arc<dyn LockBackend>, raw: Arc<EtcdBackend>, key: LockKey) -> Check {
    let r = take(&*b, &key, LeaseKind::Read, "reader refused").await?;
    let writer = spawn_acquire(&b, &key, LeaseKind::Write, Duration::from_secs(30));
    queued(&raw, &key, "%rw", 2).await;
    writer.abort();
    let _ = writer.await;
    let cancelled_at = Instant::now();
    let reader = b
        .acquire_kind(
            &key,
            LeaseKind::Read,
            TTL,
            cancelled_at + Duration::from_millis(800),
        )
        .await
        .map_err(|e| format!("a reader behind a cancelled writer: {e}"))?;
    let took = cancelled_at.elapsed();
    b.release(&reader).await.map_err(err)?;
    b.release(&r).await.map_err(err)?;
    ensure(
        raw_entries(&raw, &key, "%rw").await == 0,
        "read-write entries left behind",
    )?;
    println!("reader granted {took:?} after the writer was cancelled");
    let full = take(&*b, &key, permits(2, 2), "permits refused").await?;
    let waiter = spawn_acquire(&b, &key, permits(1, 2), Duration::from_secs(30));
    queued(&raw, &key, "%sem", 2).await;
    waiter.abort();
    let _ = waiter.await;
    sleep(Duration::from_millis(300)).await;
    let left = raw_entries(&raw, &key, "%sem").await;
    b.release(&full).await.map_err(err)?;
    ensure(
        left == 1,
        format!("{left} semaphore entries after the cancel (1 held)"),
    )
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
