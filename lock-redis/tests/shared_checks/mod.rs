//! The checks of `tests/shared.rs` (moved here, issue #14, when that file
//! passed 1,200 lines): the helpers, each safety check for read-write
//! locks and semaphores (a function returning `Err(why)` on a violation),
//! the `Broken` wrapper of the real backend with one flaw each check is
//! shown failing on, and `all_checks_pass`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::{
    Downgrade, ErrorKind, Facets, FencingToken, GrantRequest, Lease, LeaseKind, LockBackend,
    LockBackendExt, LockError, LockKey, LockWrapper, async_trait,
};
use lock_redis::{RedisBackend, RedisConfig};
use tokio::time::{Instant, sleep};

pub(crate) type Check = Result<(), String>;

pub(crate) const TTL: Duration = Duration::from_secs(5);

pub(crate) fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{:x}", rand_suffix())).expect("key")
}

pub(crate) fn rand_suffix() -> u64 {
    u64::try_from(lock_core::OwnerId::random().as_u128() >> 64).unwrap_or(0)
}

pub(crate) fn permits(count: u32, limit: u32) -> LeaseKind {
    LeaseKind::permits(count, limit).expect("valid permits")
}

pub(crate) fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

pub(crate) async fn single() -> Option<(RedisServer, RedisBackend)> {
    let server = RedisServer::start().await.or_skip()?;
    let backend = RedisBackend::connect(RedisConfig::from_url(&server.url()).unwrap())
        .await
        .expect("connect");
    Some((server, backend))
}

pub(crate) async fn take(
    b: &dyn LockBackend,
    k: &LockKey,
    kind: LeaseKind,
) -> Result<Option<Lease>, String> {
    b.try_acquire_kind(k, kind, TTL)
        .await
        .map_err(|e| format!("try {kind}: {e}"))
}

/// Every Redis key of `k` left is a token counter (kept forever, like the
/// mutex's): no share, queue entry or holder detail outlived its holder.
pub(crate) async fn assert_only_counters_left(
    conn: &mut redis::aio::MultiplexedConnection,
    k: &LockKey,
) {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{k}*"))
        .query_async(conn)
        .await
        .unwrap();
    keys.sort();
    assert!(
        keys.iter().all(|name| name.ends_with(":counters")),
        "left behind: {keys:?}"
    );
}

// ---------------------------------------------------------------- checks

/// Whether tries of `kind` start being refused within 2 s (a waiter just
/// spawned needs a moment to queue; a try that got in before it did is
/// released at once and tried again).
pub(crate) async fn refused_soon(
    b: &dyn LockBackend,
    k: &LockKey,
    kind: LeaseKind,
) -> Result<bool, String> {
    let start = Instant::now();
    sleep(Duration::from_millis(50)).await;
    while start.elapsed() < Duration::from_secs(2) {
        match take(b, k, kind).await? {
            None => return Ok(true),
            Some(lease) => {
                b.release(&lease).await.map_err(|e| e.to_string())?;
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
    Ok(false)
}

/// A writer excludes readers and writers; readers share; read tokens are
/// the latest write token; write tokens exceed every earlier grant.
pub(crate) async fn check_rw_basics(b: &dyn LockBackend, k: &LockKey) -> Check {
    let r1 = take(b, k, LeaseKind::Read)
        .await?
        .ok_or("first reader refused")?;
    let r2 = take(b, k, LeaseKind::Read)
        .await?
        .ok_or("second reader refused beside a reader")?;
    if r1.token() != r2.token() || r1.token().get() != 0 {
        return Err(format!(
            "readers of a never-written lock carry {} and {}, not 0",
            r1.token(),
            r2.token()
        ));
    }
    if take(b, k, LeaseKind::Write).await?.is_some() {
        return Err("a writer was granted beside readers".into());
    }
    b.release(&r1).await.map_err(|e| e.to_string())?;
    b.release(&r2).await.map_err(|e| e.to_string())?;
    let w1 = take(b, k, LeaseKind::Write)
        .await?
        .ok_or("writer refused on a free lock")?;
    if w1.token() <= r1.token() {
        return Err(format!(
            "write token {} not above {}",
            w1.token(),
            r1.token()
        ));
    }
    if take(b, k, LeaseKind::Read).await?.is_some() {
        return Err("a reader was granted beside a writer".into());
    }
    if take(b, k, LeaseKind::Write).await?.is_some() {
        return Err("a second writer was granted".into());
    }
    b.release(&w1).await.map_err(|e| e.to_string())?;
    let r3 = take(b, k, LeaseKind::Read).await?.ok_or("reader refused")?;
    if r3.token() != w1.token() {
        return Err(format!(
            "a reader after write {} carries {}",
            w1.token(),
            r3.token()
        ));
    }
    b.release(&r3).await.map_err(|e| e.to_string())?;
    let w2 = take(b, k, LeaseKind::Write)
        .await?
        .ok_or("writer refused")?;
    if w2.token() <= w1.token() {
        return Err(format!(
            "write token {} not above the earlier {}",
            w2.token(),
            w1.token()
        ));
    }
    b.release(&w2).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Under contention (several tasks, reads and writes): nobody beside a
/// writer, and readers observed inside together.
pub(crate) async fn check_rw_contention(b: Arc<dyn LockBackend>, k: &LockKey) -> Check {
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let max_readers = Arc::new(AtomicI64::new(0));
    let violation: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..6u32 {
        let (b, k) = (b.clone(), k.clone());
        let (readers, writers, max_readers, violation) = (
            readers.clone(),
            writers.clone(),
            max_readers.clone(),
            violation.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..25u32 {
                let write = (task + round) % 3 == 0;
                let kind = if write {
                    LeaseKind::Write
                } else {
                    LeaseKind::Read
                };
                let lease = b
                    .acquire_kind(&k, kind, TTL, soon(10_000))
                    .await
                    .map_err(|e| format!("{kind}: {e}"))?;
                let bad = if write {
                    let w = writers.fetch_add(1, Ordering::SeqCst);
                    let r = readers.load(Ordering::SeqCst);
                    (w != 0 || r != 0).then(|| format!("writer beside {w} writers, {r} readers"))
                } else {
                    let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    max_readers.fetch_max(r, Ordering::SeqCst);
                    let w = writers.load(Ordering::SeqCst);
                    (w != 0).then(|| format!("reader beside {w} writers"))
                };
                if let Some(bad) = bad {
                    violation.lock().unwrap().get_or_insert(bad);
                }
                sleep(Duration::from_millis(if write { 2 } else { 6 })).await;
                if write {
                    writers.fetch_sub(1, Ordering::SeqCst);
                } else {
                    readers.fetch_sub(1, Ordering::SeqCst);
                }
                b.release(&lease).await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    if let Some(bad) = violation.lock().unwrap().take() {
        return Err(bad);
    }
    if max_readers.load(Ordering::SeqCst) < 2 {
        return Err("readers were never observed inside together".into());
    }
    Ok(())
}

/// Writer preference: once a writer waits, a new reader is refused, and
/// the writer gets the lock when the old reader leaves (by notification,
/// well before the reader's TTL).
pub(crate) async fn check_writer_preference(b: Arc<dyn LockBackend>, k: &LockKey) -> Check {
    let reader = take(&*b, k, LeaseKind::Read)
        .await?
        .ok_or("reader refused")?;
    let writer = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.acquire_kind(&k, LeaseKind::Write, TTL, soon(4_000)).await })
    };
    if !refused_soon(&*b, k, LeaseKind::Read).await? {
        b.release(&reader).await.map_err(|e| e.to_string())?;
        let _ = writer.await;
        return Err("a new reader got in while a writer was waiting".into());
    }
    let released = Instant::now();
    b.release(&reader).await.map_err(|e| e.to_string())?;
    let w = writer
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the waiting writer: {e}"))?;
    let took = released.elapsed();
    b.release(&w).await.map_err(|e| e.to_string())?;
    if took > Duration::from_millis(400) {
        return Err(format!("the writer took {took:?} after the release"));
    }
    Ok(())
}

/// Downgrade: same token, no gap (a racing writer never gets in between),
/// the write lease is dead afterwards.
pub(crate) async fn check_downgrade(b: Arc<dyn LockBackend>, k: &LockKey) -> Check {
    let main_holds = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let intruded = Arc::new(AtomicU32::new(0));
    let racer = {
        let (b, k) = (b.clone(), k.clone());
        let (main_holds, stop, intruded) = (main_holds.clone(), stop.clone(), intruded.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Some(w)) = b.try_acquire_kind(&k, LeaseKind::Write, TTL).await {
                    if main_holds.load(Ordering::SeqCst) {
                        intruded.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = b.release(&w).await;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut result = Ok(());
    for _ in 0..40 {
        let w = match b.acquire_kind(k, LeaseKind::Write, TTL, soon(5_000)).await {
            Ok(w) => w,
            Err(e) => {
                result = Err(format!("write: {e}"));
                break;
            }
        };
        main_holds.store(true, Ordering::SeqCst);
        let r = match b.downgrade(&w).await {
            Ok(r) => r,
            Err(e) => {
                result = Err(format!("downgrade failed: {e}"));
                break;
            }
        };
        if r.token() != w.token() || r.kind() != LeaseKind::Read {
            result = Err(format!(
                "downgrade gave {} token {}, the writer had {}",
                r.kind(),
                r.token(),
                w.token()
            ));
            break;
        }
        match b.renew(&w).await {
            Err(e) if e.kind() == ErrorKind::NotHeld => {}
            other => {
                result = Err(format!("renewing the downgraded write lease: {other:?}"));
                break;
            }
        }
        if b.release(&w).await.map_err(|e| e.to_string())? {
            result = Err("releasing the downgraded write lease said released".into());
            break;
        }
        if b.renew(&r).await.is_err() {
            result = Err("the read lease from the downgrade does not renew".into());
            break;
        }
        main_holds.store(false, Ordering::SeqCst);
        b.release(&r).await.map_err(|e| e.to_string())?;
    }
    stop.store(true, Ordering::SeqCst);
    let _ = racer.await;
    result?;
    match intruded.load(Ordering::SeqCst) {
        0 => Ok(()),
        n => Err(format!("a writer got in during a downgrade {n} times")),
    }
}

/// Never more than `limit` permits; holders observed together; tokens
/// strictly increase per grant.
pub(crate) async fn check_semaphore_limit(b: Arc<dyn LockBackend>, k: &LockKey) -> Check {
    // Deterministic first: 3 of 3 held, a 4th is refused.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(take(&*b, k, permits(1, 3)).await?.ok_or("permit refused")?);
    }
    if let Some(extra) = take(&*b, k, permits(1, 3)).await? {
        b.release(&extra).await.map_err(|e| e.to_string())?;
        for l in &held {
            b.release(l).await.map_err(|e| e.to_string())?;
        }
        return Err("a 4th permit of 3 was granted".into());
    }
    let tokens: Vec<u64> = held.iter().map(|l| l.token().get()).collect();
    if !tokens.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!("permit tokens do not increase: {tokens:?}"));
    }
    for l in &held {
        b.release(l).await.map_err(|e| e.to_string())?;
    }
    // Contention: 6 tasks on 3 permits.
    let inside = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (b, k, inside, most) = (b.clone(), k.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let lease = b
                    .acquire_kind(&k, permits(1, 3), TTL, soon(10_000))
                    .await
                    .map_err(|e| e.to_string())?;
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                sleep(Duration::from_millis(4)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                b.release(&lease).await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    match most.load(Ordering::SeqCst) {
        n if n > 3 => Err(format!("{n} permit holders of 3 inside together")),
        n if n < 2 => Err("permit holders were never observed together".into()),
        _ => Ok(()),
    }
}

/// FIFO: a big waiting request at the head is not overtaken by a small
/// later one, and gets its permits when they free.
pub(crate) async fn check_semaphore_fifo(b: Arc<dyn LockBackend>, k: &LockKey) -> Check {
    let two = take(&*b, k, permits(2, 3)).await?.ok_or("2 of 3 refused")?;
    let big = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.acquire_kind(&k, permits(3, 3), TTL, soon(4_000)).await })
    };
    if !refused_soon(&*b, k, permits(1, 3)).await? {
        b.release(&two).await.map_err(|e| e.to_string())?;
        let _ = big.await;
        return Err("a later request for 1 permit overtook a waiting request for 3".into());
    }
    b.release(&two).await.map_err(|e| e.to_string())?;
    let all = big
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the waiting request for 3: {e}"))?;
    if all.token() <= two.token() {
        return Err(format!(
            "permit token {} not above {}",
            all.token(),
            two.token()
        ));
    }
    b.release(&all).await.map_err(|e| e.to_string())?;
    Ok(())
}

// --------------------------------------------------------- broken doubles

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Flaw {
    /// Readers are granted on another key: beside any writer.
    ReaderIgnoresWriter,
    /// Writers wait by polling tries: they never register as waiting.
    WriterDoesNotQueue,
    /// Downgrade = release the write lease, then take a read lease (a gap).
    DowngradeWithGap,
    /// Semaphores grant one permit more than their limit.
    ExtraPermit,
    /// Waiting permit requests poll instead of queueing (no FIFO).
    PermitsDoNotQueue,
    /// Write leases report a token of 1.
    StaleWriteToken,
}

#[derive(Debug)]
pub(crate) struct Broken {
    inner: RedisBackend,
    flaw: Flaw,
}

impl Broken {
    pub(crate) fn wrap(inner: &RedisBackend, flaw: Flaw) -> Arc<dyn LockBackend> {
        Arc::new(Self {
            inner: inner.clone(),
            flaw,
        })
    }

    fn shadow(key: &LockKey) -> LockKey {
        LockKey::new(format!("{key}-shadow")).unwrap()
    }

    /// A try of `kind` with the flaw applied (the wrapper's tries, and
    /// the polls of its flawed waits).
    async fn try_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        match (self.flaw, kind) {
            (Flaw::ReaderIgnoresWriter, LeaseKind::Read) => {
                self.inner
                    .try_acquire_kind(&Self::shadow(key), kind, ttl)
                    .await
            }
            (Flaw::ExtraPermit, LeaseKind::Permits { count, limit }) => {
                self.inner
                    .try_acquire_kind(key, permits(count, limit + 1), ttl)
                    .await
            }
            (Flaw::StaleWriteToken, LeaseKind::Write) => {
                Ok(self.inner.try_acquire_kind(key, kind, ttl).await?.map(|l| {
                    Lease::from_parts(
                        l.key().clone(),
                        l.owner(),
                        FencingToken::new(1),
                        l.ttl(),
                        l.validity_deadline(),
                        String::new(),
                    )
                    .with_kind(kind)
                }))
            }
            _ => self.inner.try_acquire_kind(key, kind, ttl).await,
        }
    }

    async fn poll(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        loop {
            if let Some(lease) = self.try_kind(key, kind, ttl).await? {
                return Ok(lease);
            }
            if Instant::now() >= deadline {
                return Err(LockError::new(
                    ErrorKind::Contended,
                    lock_core::Operation::Acquire,
                    "held",
                ));
            }
            sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Overrides only the calls a flaw changes; the rest reach the real
/// backend. A flawed wait goes through the flawed tries (the inner
/// backend's wait would not); the mutex is the real backend's.
#[async_trait]
impl LockWrapper for Broken {
    fn inner(&self) -> &dyn LockBackend {
        &self.inner
    }
    fn name(&self) -> &'static str {
        "broken-redis"
    }
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        if kind == LeaseKind::Exclusive {
            return self.inner.grant(request).await;
        }
        let Some(deadline) = deadline else {
            return self.try_kind(key, kind, ttl).await;
        };
        match (self.flaw, kind) {
            (Flaw::WriterDoesNotQueue, LeaseKind::Write)
            | (Flaw::PermitsDoNotQueue, LeaseKind::Permits { .. })
            | (Flaw::ReaderIgnoresWriter | Flaw::ExtraPermit | Flaw::StaleWriteToken, _) => {
                self.poll(key, kind, ttl, deadline).await.map(Some)
            }
            _ => self.inner.grant(request).await,
        }
    }
    /// The real backend's facets, with this double's downgrade.
    fn facets(&self) -> Facets<'_> {
        Facets {
            downgrade: Some(self),
            ..self.inner.facets()
        }
    }
}

#[async_trait]
impl Downgrade for Broken {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        if self.flaw == Flaw::DowngradeWithGap {
            self.inner.release(lease).await?;
            return self
                .inner
                .try_acquire_kind(lease.key(), LeaseKind::Read, lease.ttl())
                .await?
                .ok_or_else(|| {
                    LockError::new(ErrorKind::NotHeld, lock_core::Operation::Downgrade, "lost")
                });
        }
        LockBackendExt::downgrade(&self.inner, lease).await
    }
}

/// Runs every check on `backend` (one server or a cluster).
pub(crate) async fn all_checks_pass(backend: &RedisBackend) {
    let b: Arc<dyn LockBackend> = Arc::new(backend.clone());
    check_rw_basics(&*b, &key("basics")).await.unwrap();
    check_rw_contention(b.clone(), &key("contention"))
        .await
        .unwrap();
    check_writer_preference(b.clone(), &key("preference"))
        .await
        .unwrap();
    check_downgrade(b.clone(), &key("downgrade")).await.unwrap();
    check_semaphore_limit(b.clone(), &key("limit"))
        .await
        .unwrap();
    check_semaphore_fifo(b.clone(), &key("fifo")).await.unwrap();
}
