//! Cases on read-write locks, semaphores and segmented locks, run on every
//! backend whose capabilities claim them (skipped, saying why, elsewhere).
//!
//! Exclusion and limits are judged from the recorded history (readers may
//! overlap readers, permits may overlap permits up to the limit, nothing
//! else may overlap); concurrency is *observed*: readers and permit holders
//! must actually be inside together, or the case fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{ErrorKind, LeaseKind, LockClient, LockShape, TtlModel};
use tokio::sync::Barrier;
use tokio::time::{Instant, sleep, timeout};

use crate::harness::Harness;
use crate::harness::SuiteConfig;
use crate::history::{CheckReport, History, Op, Recorder};

use super::*;

fn skip_unless(h_caps: lock_core::Capabilities, shape: LockShape) -> Option<Outcome> {
    let (claimed, what) = match shape {
        LockShape::ReadWrite => (h_caps.shared_locks, "read-write locks"),
        LockShape::Semaphore => (h_caps.semaphores, "semaphores"),
        _ => (true, ""),
    };
    (!claimed).then(|| Outcome::Skipped(format!("the backend does not claim {what}")))
}

async fn recorded_acquire_kind(
    backend: &dyn LockBackend,
    rec: &Recorder,
    key: &LockKey,
    kind: LeaseKind,
    ttl: Duration,
    deadline: Instant,
) -> Result<Lease, lock_core::LockError> {
    rec.invoke(Op::Acquire, key, None);
    match backend.acquire_kind(key, kind, ttl, deadline).await {
        Ok(lease) => {
            rec.acquired_kind(key, kind, lease.token(), lease.validity_deadline());
            Ok(lease)
        }
        Err(e) => {
            rec.failed(Op::Acquire, key, None);
            Err(e)
        }
    }
}

async fn take_kind(
    backend: &dyn LockBackend,
    key: &LockKey,
    kind: LeaseKind,
    ttl: Duration,
) -> Result<Lease, String> {
    backend
        .try_acquire_kind(key, kind, ttl)
        .await
        .map_err(fmt_err("try_acquire_kind"))?
        .ok_or_else(|| format!("{kind} on {key} was refused although nothing conflicts"))
}

/// Whether `n` holders of `kind` on `key` (spread over `clients`) were
/// observed inside together: each takes its grant, then waits up to TTL/2
/// for all the others before releasing.
async fn held_together(
    clients: &[Arc<dyn LockBackend>],
    key: &LockKey,
    kind: LeaseKind,
    n: usize,
    ttl: Duration,
) -> Result<bool, String> {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let backend = clients[i % clients.len()].clone();
        let (key, barrier) = (key.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let lease = backend
                .acquire_kind(&key, kind, ttl, Instant::now() + ttl)
                .await?;
            let together = timeout(ttl / 2, barrier.wait()).await.is_ok();
            backend.release(&lease).await?;
            Ok::<bool, lock_core::LockError>(together)
        }));
    }
    let mut all = true;
    for task in tasks {
        all &= task
            .await
            .map_err(|e| format!("holder panicked: {e}"))?
            .map_err(fmt_err(&format!("{kind} holder")))?;
    }
    Ok(all)
}

/// What the contention tasks observe while they hold a grant: counters
/// beside the history, judged by the case.
trait Occupancy: Send + Sync + 'static {
    /// A grant of `kind` was just taken.
    fn enter(&self, kind: LeaseKind);
    /// The grant of `kind` is about to be released.
    fn leave(&self, kind: LeaseKind);
}

/// Readers and writers inside, and how often a writer was inside beside
/// anyone.
#[derive(Default)]
struct ReadersAndWriters {
    writers: AtomicUsize,
    readers: AtomicUsize,
    violations: AtomicUsize,
}

impl ReadersAndWriters {
    /// The counter of `kind`'s side, then the other side's.
    fn sides(&self, kind: LeaseKind) -> (&AtomicUsize, &AtomicUsize) {
        if kind == LeaseKind::Write {
            (&self.writers, &self.readers)
        } else {
            (&self.readers, &self.writers)
        }
    }
}

impl Occupancy for ReadersAndWriters {
    fn enter(&self, kind: LeaseKind) {
        let (mine, other) = self.sides(kind);
        let before = mine.fetch_add(1, Ordering::SeqCst);
        if other.load(Ordering::SeqCst) > 0 || (kind == LeaseKind::Write && before > 0) {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, kind: LeaseKind) {
        self.sides(kind).0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Permits held now, and the most ever held at once.
#[derive(Default)]
struct PermitsInside {
    now: AtomicU32,
    max: AtomicU32,
}

impl Occupancy for PermitsInside {
    fn enter(&self, kind: LeaseKind) {
        let count = permit_count(kind);
        let now = self.now.fetch_add(count, Ordering::SeqCst) + count;
        self.max.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self, kind: LeaseKind) {
        self.now.fetch_sub(permit_count(kind), Ordering::SeqCst);
    }
}

/// The permits a grant of `kind` holds (none but a semaphore's).
fn permit_count(kind: LeaseKind) -> u32 {
    match kind {
        LeaseKind::Permits { count, .. } => count,
        _ => 0,
    }
}

/// Contention on `key`: `cfg.tasks` tasks spread over `clients`, each
/// taking `kind_of(task, iteration)` `cfg.iterations` times (waiting up to
/// a minute), inside for 300 µs between `inside`'s `enter` and `leave`.
/// Every grant and release is recorded; returns the history's check.
async fn contend(
    clients: &[Arc<dyn LockBackend>],
    key: &LockKey,
    ttl: Duration,
    cfg: SuiteConfig,
    kind_of: impl Fn(usize, usize) -> LeaseKind + Copy + Send + 'static,
    inside: Arc<impl Occupancy>,
) -> Result<CheckReport, String> {
    let history = Arc::new(History::new());
    let mut tasks = Vec::new();
    for t in 0..cfg.tasks {
        let backend = clients[t % clients.len()].clone();
        let rec = history.process();
        let (key, inside) = (key.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..cfg.iterations {
                let kind = kind_of(t, i);
                let lease = recorded_acquire_kind(
                    &*backend,
                    &rec,
                    &key,
                    kind,
                    ttl,
                    Instant::now() + Duration::from_secs(60),
                )
                .await?;
                inside.enter(kind);
                sleep(Duration::from_micros(300)).await;
                inside.leave(kind);
                rec.invoke(Op::Release, lease.key(), Some(lease.token()));
                let held = backend.release(&lease).await?;
                rec.released(lease.key(), lease.token(), held);
            }
            Ok::<(), lock_core::LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| format!("task panicked: {e}"))?
            .map_err(fmt_err("contention task"))?;
    }
    Ok(history.check())
}

/// Readers and writers on one key over several clients: no writer ever
/// beside anyone (observed by counters and judged from the history), read
/// tokens equal the latest write token, and readers are observed inside
/// together.
pub async fn readers_share_writers_exclude(h: &Harness) -> CaseResult {
    let cfg = *h.config();
    let clients = clients(h, cfg.clients).await?;
    let caps = clients[0].capabilities();
    if let Some(skip) = skip_unless(caps, LockShape::ReadWrite) {
        return Ok(skip);
    }
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("rw");
    // 1. Readers really share: three readers must be inside together.
    let readers = 3;
    ensure!(
        held_together(&clients, &key, LeaseKind::Read, readers, ttl).await?,
        "{readers} readers were never inside together: read locks are not shared"
    );
    // 2. Contention: every third grant a writer.
    let inside = Arc::new(ReadersAndWriters::default());
    let kind_of = |t: usize, i: usize| {
        if (t + i).is_multiple_of(3) {
            LeaseKind::Write
        } else {
            LeaseKind::Read
        }
    };
    let report = contend(&clients, &key, ttl, cfg, kind_of, inside.clone()).await?;
    let violations = &inside.violations;
    ensure!(
        violations.load(Ordering::SeqCst) == 0,
        "a writer was inside beside someone {} time(s); {}",
        violations.load(Ordering::SeqCst),
        report.summary()
    );
    ensure!(report.is_exclusive(), "history: {}", report.summary());
    if caps.has_fencing() {
        ensure!(
            report.read_token_mismatches == 0 && report.token_regressions == 0,
            "tokens not as documented: {}",
            report.summary()
        );
    }
    Ok(Outcome::Passed(format!(
        "{readers} readers inside together; {}",
        report.summary()
    )))
}

/// A stream of overlapping readers never keeps a waiting writer out for
/// long: once it waits, new readers queue behind it.
pub async fn writers_are_not_starved(h: &Harness) -> CaseResult {
    let clients = clients(h, 3).await?;
    let caps = clients[0].capabilities();
    if let Some(skip) = skip_unless(caps, LockShape::ReadWrite) {
        return Ok(skip);
    }
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("starve");
    let stream_for = Duration::from_secs(3);
    let hold = Duration::from_millis(150);
    let stop_at = Instant::now() + stream_for;
    let reads = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    // Two readers that overlap each other: without writer preference the
    // key is never free of readers for the whole stream.
    for (i, backend) in clients.iter().take(2).enumerate() {
        let backend = backend.clone();
        let (key, reads) = (key.clone(), reads.clone());
        readers.push(tokio::spawn(async move {
            if i > 0 {
                sleep(hold / 2).await;
            }
            while Instant::now() < stop_at {
                match backend
                    .acquire_kind(&key, LeaseKind::Read, ttl, stop_at)
                    .await
                {
                    Ok(lease) => {
                        reads.fetch_add(1, Ordering::SeqCst);
                        sleep(hold).await;
                        let _ = backend.release(&lease).await;
                    }
                    Err(e) if e.is_contended() => {}
                    Err(e) => return Err(e),
                }
            }
            Ok::<(), lock_core::LockError>(())
        }));
    }
    sleep(Duration::from_millis(400)).await;
    let writer = &clients[2];
    let asked = Instant::now();
    let lease = writer
        .acquire_kind(&key, LeaseKind::Write, ttl, stop_at + ttl)
        .await
        .map_err(fmt_err("the writer"))?;
    let waited = asked.elapsed();
    let granted_at = Instant::now();
    writer
        .release(&lease)
        .await
        .map_err(fmt_err("release the writer"))?;
    for reader in readers {
        reader
            .await
            .map_err(|e| format!("reader panicked: {e}"))?
            .map_err(fmt_err("reader"))?;
    }
    ensure!(
        granted_at < stop_at,
        "the writer waited {waited:?}, until the stream of readers ended: writers starve"
    );
    Ok(Outcome::Passed(format!(
        "the writer got in after {waited:?} while readers kept coming ({} reads in {stream_for:?})",
        reads.load(Ordering::SeqCst)
    )))
}

/// A writer that downgrades (the [`Downgrade`](lock_core::Downgrade)
/// facet) becomes a reader with no gap: a waiting writer does not get in
/// until the downgraded reader leaves, the read lease keeps the write
/// token, and the old write lease is gone. Upgrading a read lock is
/// refused. Runs where the backend has the facet; a backend that claims
/// read-write locks without it fails (a read-write lock downgrades).
pub async fn downgrade_leaves_no_gap(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    if a.facets().downgrade.is_none() {
        ensure!(
            !caps.shared_locks,
            "the backend claims read-write locks (capabilities' shared_locks) but has no Downgrade facet"
        );
        return Ok(without_facet("Downgrade", "downgrade"));
    }
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("downgrade");
    let write = take_kind(&*a, &key, LeaseKind::Write, ttl).await?;
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            b.acquire_kind(&key, LeaseKind::Write, ttl, Instant::now() + ttl * 3)
                .await
        })
    };
    sleep(Duration::from_millis(200)).await;
    let read = served(a.downgrade(&write).await, "Downgrade", "downgrade")?;
    ensure!(
        read.kind() == LeaseKind::Read,
        "downgrade returned {}",
        read.kind()
    );
    sleep(Duration::from_millis(500)).await;
    ensure!(
        !waiting.is_finished(),
        "a waiting writer got in during or after the downgrade, while the downgraded reader held the lock"
    );
    if caps.has_fencing() {
        ensure!(
            read.token() == write.token(),
            "the read lease's token {} is not the write token {}",
            read.token(),
            write.token()
        );
    }
    let holders = a
        .holders(&key, LockShape::ReadWrite)
        .await
        .map_err(fmt_err("holders"))?;
    ensure!(
        holders.len() == 1 && holders[0].kind == LeaseKind::Read,
        "holders after downgrade: {holders:?}"
    );
    ensure!(
        a.renew(&write).await.is_err(),
        "the write lease could still be renewed after the downgrade"
    );
    a.renew(&read)
        .await
        .map_err(fmt_err("renew the read lease"))?;
    ensure!(
        a.release(&read).await.map_err(fmt_err("release read"))?,
        "the read lease was not held"
    );
    let next = waiting
        .await
        .map_err(|e| format!("waiter panicked: {e}"))?
        .map_err(fmt_err("the waiting writer"))?;
    if caps.has_fencing() {
        ensure!(
            next.token() > write.token(),
            "the next writer's token {} is not above {}",
            next.token(),
            write.token()
        );
    }
    b.release(&next).await.map_err(fmt_err("release"))?;
    // Upgrade is refused, at the guard.
    let client = LockClient::from_arc(a.clone());
    let guard = client
        .read_lock(key.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .map_err(fmt_err("read lock"))?;
    let refused = guard.upgrade().map_err(|e| e.kind());
    guard.release().await.map_err(fmt_err("release"))?;
    ensure!(
        refused == Err(ErrorKind::WouldDeadlock),
        "upgrade gave {refused:?}"
    );
    Ok(Outcome::Passed(
        "no writer entered while the downgraded reader held; token kept; upgrade refused".into(),
    ))
}

/// Many tasks taking 1 or 2 permits of a semaphore of 3: never more than 3
/// held (counted and judged from the history), and holders observed inside
/// together.
pub async fn permits_never_exceed_limit(h: &Harness) -> CaseResult {
    let cfg = *h.config();
    let clients = clients(h, cfg.clients).await?;
    let caps = clients[0].capabilities();
    if let Some(skip) = skip_unless(caps, LockShape::Semaphore) {
        return Ok(skip);
    }
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("permits");
    let limit = 3u32;
    // 1. Three single permits are held together.
    ensure!(
        held_together(
            &clients,
            &key,
            LeaseKind::Permits { count: 1, limit },
            3,
            ttl
        )
        .await?,
        "3 permit holders of 3 were never inside together"
    );
    // 2. Contention.
    let inside = Arc::new(PermitsInside::default());
    let kind_of = move |t: usize, i: usize| {
        let count = if (t + i).is_multiple_of(4) { 2 } else { 1 };
        LeaseKind::Permits { count, limit }
    };
    let report = contend(&clients, &key, ttl, cfg, kind_of, inside.clone()).await?;
    let max = inside.max.load(Ordering::SeqCst);
    ensure!(
        max <= limit,
        "{max} permits of {limit} were held at once; {}",
        report.summary()
    );
    ensure!(report.is_exclusive(), "history: {}", report.summary());
    ensure!(
        report.duplicate_tokens == 0,
        "permit grants shared a token: {}",
        report.summary()
    );
    Ok(Outcome::Passed(format!(
        "max {max} of {limit} permits in use; {}",
        report.summary()
    )))
}

/// A semaphore's limit is agreed: a request with another limit while it is
/// in use is refused, bad counts are refused, and an idle semaphore takes
/// a new limit.
pub async fn semaphore_limits_are_checked(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    if let Some(skip) = skip_unless(caps, LockShape::Semaphore) {
        return Ok(skip);
    }
    let ttl = h.ttl_for(&caps).max(Duration::from_secs(5));
    let key = h.key("limits");
    let held = take_kind(&*a, &key, LeaseKind::Permits { count: 2, limit: 3 }, ttl).await?;
    let other = b
        .try_acquire_kind(&key, LeaseKind::Permits { count: 1, limit: 4 }, ttl)
        .await;
    ensure!(
        matches!(&other, Err(e) if e.kind() == ErrorKind::InvalidArgument),
        "another limit while in use gave {other:?}"
    );
    let too_many = b
        .try_acquire_kind(&key, LeaseKind::Permits { count: 2, limit: 3 }, ttl)
        .await
        .map_err(fmt_err("2 more of 3"))?;
    ensure!(too_many.is_none(), "granted 2 more permits beside 2 of 3");
    let one = take_kind(&*b, &key, LeaseKind::Permits { count: 1, limit: 3 }, ttl).await?;
    for (count, limit) in [(0, 3), (4, 3), (1, 0)] {
        let bad = b
            .try_acquire_kind(&key, LeaseKind::Permits { count, limit }, ttl)
            .await;
        ensure!(
            matches!(&bad, Err(e) if e.kind() == ErrorKind::InvalidArgument),
            "{count} of {limit} permits gave {bad:?}"
        );
    }
    let holders = a
        .holders(&key, LockShape::Semaphore)
        .await
        .map_err(fmt_err("holders"))?;
    let counted: u32 = holders
        .iter()
        .map(|h| match h.kind {
            LeaseKind::Permits { count, .. } => count,
            _ => 0,
        })
        .sum();
    ensure!(
        holders.len() == 2 && counted == 3,
        "holders report {holders:?}"
    );
    a.release(&held).await.map_err(fmt_err("release"))?;
    b.release(&one).await.map_err(fmt_err("release"))?;
    let renewed = take_kind(&*b, &key, LeaseKind::Permits { count: 4, limit: 4 }, ttl).await?;
    b.release(&renewed).await.map_err(fmt_err("release"))?;
    Ok(Outcome::Passed(
        "other limits and bad counts refused; an idle semaphore took a new limit".into(),
    ))
}

/// A reader or permit holder that stops renewing (crashed) frees its share
/// within its lease: a writer / a permit request waiting for it gets in by
/// the lease's end, not later and not before.
pub async fn crashed_share_is_freed(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    if !caps.shared_locks && !caps.semaphores {
        return Ok(Outcome::Skipped(
            "the backend claims neither read-write locks nor semaphores".into(),
        ));
    }
    if caps.ttl_model != TtlModel::PerLease {
        return Ok(Outcome::Skipped(
            "TTL is per session or per process: a share ends only with its session or process (see the holder scenarios)"
                .into(),
        ));
    }
    let ttl = h.ttl_for(&caps);
    let margin = h.config().margin;
    let mut done = Vec::new();
    let mut pairs = Vec::new();
    if caps.shared_locks {
        pairs.push(("reader", LeaseKind::Read, LeaseKind::Write));
    }
    if caps.semaphores {
        let one = LeaseKind::Permits { count: 1, limit: 1 };
        pairs.push(("permit holder", one, one));
    }
    for (who, crashed, waiter) in pairs {
        let key = h.key(&format!("crashed-{}", crashed.shape()));
        let started = Instant::now();
        let lease = take_kind(&*a, &key, crashed, ttl).await?;
        let next = b
            .acquire_kind(&key, waiter, ttl, started + ttl + margin)
            .await
            .map_err(|e| format!("a crashed {who}'s share was not freed within its TTL: {e}"))?;
        let got_at = Instant::now();
        ensure!(
            got_at >= lease.validity_deadline(),
            "{waiter} granted {:?} before the crashed {who}'s deadline",
            lease.validity_deadline() - got_at
        );
        ensure!(
            !a.release(&lease).await.map_err(fmt_err("stale release"))?,
            "the crashed {who}'s release said held"
        );
        ensure!(
            b.release(&next).await.map_err(fmt_err("release"))?,
            "the waiter's grant was gone after a stale release"
        );
        done.push(format!("{who} freed after {:?}", got_at - started));
    }
    Ok(Outcome::Passed(format!(
        "{} (TTL {ttl:?})",
        done.join(", ")
    )))
}

/// Cancelled waits for a write lock or for permits leave nothing: readers
/// come in again and the permits are free within the waiter's TTL.
pub async fn cancelled_share_waits_leave_nothing(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let caps = a.capabilities();
    if !caps.shared_locks && !caps.semaphores {
        return Ok(Outcome::Skipped(
            "the backend claims neither read-write locks nor semaphores".into(),
        ));
    }
    let ttl = h.ttl_for(&caps);
    let margin = h.config().margin;
    let mut done = Vec::new();
    let mut pairs = Vec::new();
    if caps.shared_locks {
        pairs.push(("write", LeaseKind::Read, LeaseKind::Write, LeaseKind::Read));
    }
    if caps.semaphores {
        let one = LeaseKind::Permits { count: 1, limit: 2 };
        let two = LeaseKind::Permits { count: 2, limit: 2 };
        pairs.push(("permits", one, two, one));
    }
    for (what, holding, cancelled, after) in pairs {
        let key = h.key(&format!("cancelled-{}", holding.shape()));
        let held = take_kind(&*a, &key, holding, ttl * 10).await?;
        let waiting = b.acquire_kind(&key, cancelled, ttl, Instant::now() + ttl * 10);
        ensure!(
            timeout(Duration::from_millis(300), waiting).await.is_err(),
            "the {what} waiter was granted beside {holding}"
        );
        // The waiter is gone: within its TTL, a request it would have
        // blocked gets in.
        let started = Instant::now();
        let next = a
            .acquire_kind(&key, after, ttl, started + ttl + margin)
            .await
            .map_err(|e| format!("a cancelled {what} waiter still blocked {after}: {e}"))?;
        done.push(format!("{what}: {after} in after {:?}", started.elapsed()));
        a.release(&next).await.map_err(fmt_err("release"))?;
        a.release(&held).await.map_err(fmt_err("release"))?;
        let check = take_kind(&*a, &key, cancelled, ttl).await.map_err(|e| {
            format!("after the cancelled {what} waiter, {cancelled} was not free: {e}")
        })?;
        a.release(&check).await.map_err(fmt_err("release"))?;
    }
    Ok(Outcome::Passed(done.join("; ")))
}

/// A segmented lock hands out distinct free segments, then waits for the
/// first to free, and says which.
pub async fn segments_take_any_free(h: &Harness) -> CaseResult {
    let (a, b) = two_clients(h).await?;
    let ttl = h.ttl_for(&a.capabilities()).max(Duration::from_secs(5));
    let key = h.key("segments");
    let (ca, cb) = (LockClient::from_arc(a), LockClient::from_arc(b));
    let segments = 3;
    let mut guards = Vec::new();
    for _ in 0..segments {
        let (index, guard) = ca
            .segments(key.as_str(), segments)
            .ttl(ttl)
            .acquire_any()
            .await
            .map_err(fmt_err("a free segment"))?;
        ensure!(
            guards.iter().all(|(i, _)| *i != index),
            "segment {index} handed out twice"
        );
        guards.push((index, guard));
    }
    let busy = cb
        .segments(key.as_str(), segments)
        .ttl(ttl)
        .acquire_any()
        .await;
    ensure!(
        matches!(&busy, Err(e) if e.is_contended()),
        "with every segment held, a try gave {:?}",
        busy.map(|(i, _)| i)
    );
    let waiter = {
        let (cb, key) = (cb.clone(), key.clone());
        tokio::spawn(async move {
            cb.segments(key.as_str(), segments)
                .ttl(ttl)
                .wait(ttl * 2)
                .acquire_any()
                .await
        })
    };
    sleep(Duration::from_millis(200)).await;
    let (freed, guard) = guards.remove(1);
    guard.release().await.map_err(fmt_err("release"))?;
    let (index, got) = waiter
        .await
        .map_err(|e| format!("waiter panicked: {e}"))?
        .map_err(fmt_err("waiting for a segment"))?;
    ensure!(
        index == freed,
        "the waiter got segment {index}, but {freed} was the one freed"
    );
    got.release().await.map_err(fmt_err("release"))?;
    for (_, guard) in guards {
        guard.release().await.map_err(fmt_err("release"))?;
    }
    Ok(Outcome::Passed(format!(
        "{segments} distinct segments, then the freed one ({freed})"
    )))
}
