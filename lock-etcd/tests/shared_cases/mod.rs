//! The broken doubles of `tests/shared.rs` ([`Broken`]) and its tests,
//! which run each check there on a real etcd and on a double (moved out of
//! `tests/shared.rs`).

use super::*;

// ---------------------------------------------------------------- doubles

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Readers are taken as writers.
    ReadAsWrite,
    /// Writers are taken as readers.
    WriteAsRead,
    /// Waits by polling, without a place in the queue.
    Polling,
    /// Downgrade releases, then takes a read lock.
    GapDowngrade,
    /// Read grants report token 0.
    ReadTokenZero,
    /// A semaphore of N grants N+1.
    PlusOnePermit,
    /// Any limit is taken as 3 (mismatches go unnoticed).
    LimitThree,
    /// A cancelled waiting writer leaves an entry that never expires.
    LeakyCancel,
}

#[derive(Debug)]
struct Broken {
    inner: Arc<EtcdBackend>,
    flaw: Flaw,
}

impl Broken {
    fn wrap(inner: Arc<EtcdBackend>, flaw: Flaw) -> Arc<dyn LockBackend> {
        Arc::new(Self { inner, flaw })
    }

    fn kind(&self, kind: LeaseKind) -> LeaseKind {
        match (self.flaw, kind) {
            (Flaw::ReadAsWrite, LeaseKind::Read) => LeaseKind::Write,
            (Flaw::WriteAsRead, LeaseKind::Write) => LeaseKind::Read,
            (Flaw::PlusOnePermit, LeaseKind::Permits { count, limit }) => LeaseKind::Permits {
                count,
                limit: limit + 1,
            },
            (Flaw::LimitThree, LeaseKind::Permits { count, .. }) => LeaseKind::Permits {
                count: count.min(3),
                limit: 3,
            },
            (_, kind) => kind,
        }
    }

    fn lease(&self, lease: Lease) -> Lease {
        if self.flaw == Flaw::ReadTokenZero && lease.kind() == LeaseKind::Read {
            let kind = lease.kind();
            return Lease::from_parts(
                lease.key().clone(),
                lease.owner(),
                FencingToken::new(0),
                lease.ttl(),
                lease.validity_deadline(),
                lease.backend_data().to_owned(),
            )
            .with_kind(kind);
        }
        lease
    }
}

crate::common::wrapper_backend! {
    Broken, "broken-etcd", self.inner,
    forward [try_acquire, acquire, renew, release, inspect],
    {
    async fn try_acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let lease = self
            .inner
            .try_acquire_kind(key, self.kind(kind), ttl)
            .await?;
        Ok(lease.map(|l| self.lease(l)))
    }
    async fn acquire_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        match self.flaw {
            Flaw::Polling => loop {
                if let Some(lease) = self.inner.try_acquire_kind(key, kind, ttl).await? {
                    return Ok(lease);
                }
                if Instant::now() >= deadline {
                    return Err(LockError::new(
                        ErrorKind::Contended,
                        lock_core::Operation::Acquire,
                        "polled",
                    ));
                }
                sleep(Duration::from_millis(20)).await;
            },
            Flaw::LeakyCancel if kind == LeaseKind::Write => {
                let entry = format!("{PREFIX}/{}%rw/leak", key.as_str());
                self.inner
                    .client()
                    .kv_client()
                    .put(entry, format!("w {}", OwnerId::random().to_hex()), None)
                    .await
                    .map_err(|e| {
                        LockError::new(
                            ErrorKind::Backend,
                            lock_core::Operation::Acquire,
                            e.to_string(),
                        )
                    })?;
                std::future::pending().await
            }
            _ => {
                let lease = self
                    .inner
                    .acquire_kind(key, self.kind(kind), ttl, deadline)
                    .await?;
                Ok(self.lease(lease))
            }
        }
    }
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        if self.flaw == Flaw::GapDowngrade {
            self.inner.release(lease).await?;
            return self
                .inner
                .acquire_kind(
                    lease.key(),
                    LeaseKind::Read,
                    lease.ttl(),
                    Instant::now() + Duration::from_secs(2),
                )
                .await;
        }
        self.inner.downgrade(lease).await
    }
    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        self.inner.holders(key, shape).await
    }
    }
}

/// Removes what a broken double left on the server.
async fn wipe(raw: &EtcdBackend, key: &LockKey) {
    for tag in ["%rw/", "%sem/"] {
        let _ = raw
            .client()
            .kv_client()
            .delete(
                format!("{PREFIX}/{}{tag}", key.as_str()),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await;
    }
}

async fn shows_failure(name: &str, result: Check) {
    match result {
        Ok(()) => panic!("the check {name} passed on a broken double"),
        Err(why) => println!("{name} caught the broken double: {why}"),
    }
}

/// A real etcd, a backend on it and the same backend as a trait object;
/// `None` when no etcd can be started here.
async fn start() -> Option<(EtcdServer, Arc<EtcdBackend>, Arc<dyn LockBackend>)> {
    let server = EtcdServer::start().await.or_skip()?;
    let real = backend(&server).await;
    let b: Arc<dyn LockBackend> = real.clone();
    Some((server, real, b))
}

/// Runs `check` on `real` wrapped with `flaw`, under a fresh key made from
/// `name`: the check `label` must fail. Then wipes what the double left.
async fn fails_on<F, Fut>(real: &Arc<EtcdBackend>, name: &str, label: &str, flaw: Flaw, check: F)
where
    F: FnOnce(Arc<dyn LockBackend>, LockKey) -> Fut,
    Fut: std::future::Future<Output = Check>,
{
    let k = key(name);
    shows_failure(
        label,
        check(Broken::wrap(real.clone(), flaw), k.clone()).await,
    )
    .await;
    wipe(real, &k).await;
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_writers_exclude() {
    let Some((_server, real, b)) = start().await else {
        return;
    };
    assert!(b.capabilities().shared_locks && b.capabilities().semaphores);
    check_readers_overlap(b.clone(), key("overlap"))
        .await
        .unwrap();
    check_writer_excluded(b.clone(), key("exclude"))
        .await
        .unwrap();
    check_writer_preference(b.clone(), real.clone(), key("prefer"))
        .await
        .unwrap();

    fails_on(
        &real,
        "overlap-broken",
        "readers overlap",
        Flaw::ReadAsWrite,
        check_readers_overlap,
    )
    .await;
    fails_on(
        &real,
        "exclude-broken",
        "writer excluded",
        Flaw::WriteAsRead,
        check_writer_excluded,
    )
    .await;
    fails_on(
        &real,
        "prefer-broken",
        "writer preference",
        Flaw::Polling,
        |b, k| check_writer_preference(b, real.clone(), k),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_and_tokens() {
    let Some((_server, real, b)) = start().await else {
        return;
    };
    check_downgrade(b.clone(), real.clone(), key("downgrade"))
        .await
        .unwrap();
    check_tokens(b.clone(), real.clone(), key("tokens"))
        .await
        .unwrap();

    // Downgrade refuses a read lease, and a write lease whose entry was
    // deleted behind its back (which is then dead for renew too).
    let k = key("downgrade-refused");
    let read = b
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        b.downgrade(&read).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert!(b.release(&read).await.unwrap());
    let write = b
        .try_acquire_kind(&k, LeaseKind::Write, TTL)
        .await
        .unwrap()
        .unwrap();
    real.client()
        .kv_client()
        .delete(
            format!("{PREFIX}/{}%rw/", k.as_str()),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(
        b.downgrade(&write).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert_eq!(
        b.renew(&write).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert!(!b.release(&write).await.unwrap());

    // Namespaces: a mutex, a read-write lock and a semaphore of one name
    // are three locks.
    let k = key("namespaces");
    let m = b.try_acquire(&k, TTL).await.unwrap().expect("mutex");
    let w = b
        .try_acquire_kind(&k, LeaseKind::Write, TTL)
        .await
        .unwrap()
        .expect("writer beside a mutex");
    let p = b
        .try_acquire_kind(&k, permits(1, 1), TTL)
        .await
        .unwrap()
        .expect("permit beside both");
    assert!(
        b.try_acquire(&k, TTL).await.unwrap().is_none(),
        "the mutex is still one"
    );
    for lease in [&m, &w, &p] {
        assert!(b.release(lease).await.unwrap());
    }

    fails_on(
        &real,
        "downgrade-broken",
        "downgrade",
        Flaw::GapDowngrade,
        |b, k| check_downgrade(b, real.clone(), k),
    )
    .await;
    fails_on(
        &real,
        "tokens-broken",
        "tokens",
        Flaw::ReadTokenZero,
        |b, k| check_tokens(b, real.clone(), k),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_limits() {
    let Some((_server, real, b)) = start().await else {
        return;
    };
    check_semaphore_limit(b.clone(), real.clone(), key("limit"))
        .await
        .unwrap();
    check_limit_mismatch(b.clone(), real.clone(), key("mismatch"))
        .await
        .unwrap();

    fails_on(
        &real,
        "limit-broken",
        "semaphore limit",
        Flaw::PlusOnePermit,
        |b, k| check_semaphore_limit(b, real.clone(), k),
    )
    .await;
    fails_on(
        &real,
        "fifo-broken",
        "semaphore FIFO",
        Flaw::Polling,
        |b, k| check_semaphore_limit(b, real.clone(), k),
    )
    .await;
    fails_on(
        &real,
        "mismatch-broken",
        "limit mismatch",
        Flaw::LimitThree,
        |b, k| check_limit_mismatch(b, real.clone(), k),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_and_cancelled_holders_free_their_share() {
    let Some((server, real, b)) = start().await else {
        return;
    };
    check_cancel(b.clone(), real.clone(), key("cancel"))
        .await
        .unwrap();
    let crash_config = config(&server, Duration::from_secs(1));
    // A real crash: another backend takes the share and is dropped without
    // releasing (its keep-alive stops, nothing is revoked).
    let crash = |key: LockKey, kind: LeaseKind| {
        let crash_config = crash_config.clone();
        async move {
            let other = EtcdBackend::connect(crash_config).await.expect("connect");
            let lease = other
                .try_acquire_kind(&key, kind, Duration::from_secs(1))
                .await
                .expect("crash holder")
                .expect("granted");
            drop(lease);
            drop(other);
        }
    };
    check_crash_freed(b.clone(), key("crash"), crash)
        .await
        .unwrap();

    // A lease moved to another process by its handle is renewed and
    // released there.
    let k = key("handle");
    let read = b
        .try_acquire_kind(&k, LeaseKind::Read, TTL)
        .await
        .unwrap()
        .expect("reader");
    let moved = Lease::from_handle(&read.to_handle()).expect("handle");
    assert_eq!(moved.kind(), LeaseKind::Read);
    let elsewhere = backend(&server).await;
    elsewhere.renew(&moved).await.expect("renew elsewhere");
    let holders = elsewhere.holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].holder, read.owner().to_hex());
    assert!(holders[0].remaining_ttl.is_some());
    assert!(elsewhere.release(&moved).await.expect("release elsewhere"));
    assert!(!b.release(&read).await.unwrap(), "released twice");
    assert_eq!(raw_entries(&real, &k, "%rw").await, 0);

    fails_on(
        &real,
        "cancel-broken",
        "cancel",
        Flaw::LeakyCancel,
        |b, k| check_cancel(b, real.clone(), k),
    )
    .await;
    // A broken "crash" whose share is not tied to any lease.
    let raw = real.clone();
    let leaky_crash = |key: LockKey, kind: LeaseKind| {
        let raw = raw.clone();
        async move {
            let tag = if kind == LeaseKind::Read {
                "%rw"
            } else {
                "%sem"
            };
            raw.client()
                .kv_client()
                .put(
                    format!("{PREFIX}/{}{tag}/leaked", key.as_str()),
                    format!("{} {}", kind.code(), OwnerId::random().to_hex()),
                    None,
                )
                .await
                .expect("raw put");
        }
    };
    let k = key("crash-broken");
    shows_failure(
        "crash freed",
        check_crash_freed(b.clone(), k.clone(), leaky_crash).await,
    )
    .await;
    wipe(&real, &k).await;
}

/// The permit floor takes permits of the driver's semaphores (same layout,
/// same limit rule) and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_floor_uses_the_driver_layout() {
    use lock_core::floor::RawFloor;
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let real = backend(&server).await;
    let floor = lock_etcd::floor::EtcdPermitFloor::from_backend(&real, 1, 2)
        .await
        .expect("floor");
    assert_eq!(floor.round_trips_per_cycle(), 2);
    let k = key("floor");
    for _ in 0..3 {
        floor.cycle(k.as_str(), TTL).await.expect("cycle");
    }
    let held = real
        .try_acquire_kind(&k, permits(2, 2), TTL)
        .await
        .unwrap()
        .expect("2 of 2");
    assert!(
        floor.try_grant(k.as_str(), TTL).await.unwrap().is_none(),
        "the floor overfilled"
    );
    assert!(real.release(&held).await.unwrap());
    let one = real
        .try_acquire_kind(&k, permits(1, 2), TTL)
        .await
        .unwrap()
        .expect("1 of 2");
    let grant = floor
        .try_grant(k.as_str(), TTL)
        .await
        .unwrap()
        .expect("the floor's permit");
    assert!(grant.token > one.token().get());
    assert!(
        real.try_acquire_kind(&k, permits(1, 2), TTL)
            .await
            .unwrap()
            .is_none(),
        "3 of 2"
    );
    assert!(floor.release(&grant).await.unwrap());
    assert!(real.release(&one).await.unwrap());
    let wrong = real
        .try_acquire_kind(&k, permits(1, 3), TTL)
        .await
        .unwrap()
        .expect("idle: 1 of 3");
    let refused = floor.try_grant(k.as_str(), TTL).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    assert!(real.release(&wrong).await.unwrap());
    assert_eq!(raw_entries(&real, &k, "%sem").await, 0);
    // The descriptor's permit floor: one permit of 4.
    let url = server.url(PREFIX, "ttl=2s&timeout=1s");
    let described = (lock_etcd::DRIVER.permit_floor.expect("permit floor"))(&url)
        .await
        .expect("connect")
        .expect("a floor");
    let three = real
        .try_acquire_kind(&k, permits(3, 4), TTL)
        .await
        .unwrap()
        .expect("3 of 4");
    described
        .cycle(k.as_str(), TTL)
        .await
        .expect("the 4th permit");
    assert!(real.release(&three).await.unwrap());
}

/// A stalled holder keeps its session alive but never renews: its share is
/// deleted by the session's expiry task at the end of its own TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_share_expires_with_its_ttl() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let b: Arc<dyn LockBackend> = backend(&server).await;
    let crash_config = config(&server, Duration::from_secs(1));
    // A stalled holder: its process lives (the session lease is kept
    // alive) but it never renews: the share goes with its own TTL (the
    // session's expiry task deletes entries whose value is not a bare
    // owner id, too).
    let stall = |key: LockKey, kind: LeaseKind| {
        let crash_config = crash_config.clone();
        async move {
            let other = EtcdBackend::connect(crash_config).await.expect("connect");
            let lease = other
                .try_acquire_kind(&key, kind, Duration::from_secs(1))
                .await
                .expect("stalled holder")
                .expect("granted");
            drop(lease);
            // Never dropped: its keep-alive runs until the test ends.
            std::mem::forget(other);
        }
    };
    check_crash_freed(b.clone(), key("stall"), stall)
        .await
        .unwrap();
}

/// Readers, writers and permit holders contend on a 3-member cluster while
/// the leader is killed and restarted: the history checker (kind-aware)
/// finds no writer beside anyone, no semaphore over its limit, tokens as
/// documented, and grants continue after the fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_contention_survives_leader_kill_and_restart() {
    use conformance::history::{History, Op};
    use std::sync::atomic::AtomicBool;
    let Some(mut server) = EtcdServer::start_cluster(3).await.or_skip() else {
        return;
    };
    let clients = [backend(&server).await, backend(&server).await];
    let rw = key("chaos-rw");
    let sem = key("chaos-sem");
    let history = Arc::new(History::new());
    let stop = Arc::new(AtomicBool::new(false));
    let last_grant = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let mut tasks = Vec::new();
    for t in 0..8usize {
        let backend = clients[t % 2].clone();
        let rec = history.process();
        let (stop, last_grant) = (stop.clone(), last_grant.clone());
        let (key, kind) = match t {
            0 | 1 => (rw.clone(), LeaseKind::Write),
            2..=4 => (rw.clone(), LeaseKind::Read),
            _ => (sem.clone(), permits(1 + u32::from(t == 7), 2)),
        };
        tasks.push(tokio::spawn(async move {
            let mut grants = 0usize;
            while !stop.load(Ordering::SeqCst) {
                rec.invoke(Op::Acquire, &key, None);
                let lease = match backend
                    .acquire_kind(&key, kind, TTL, Instant::now() + Duration::from_secs(10))
                    .await
                {
                    Ok(lease) => lease,
                    Err(_) => {
                        rec.failed(Op::Acquire, &key, None);
                        sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                rec.acquired_kind(&key, kind, lease.token(), lease.validity_deadline());
                grants += 1;
                *last_grant.lock().unwrap() = Some(Instant::now());
                sleep(Duration::from_millis(5)).await;
                rec.invoke(Op::Release, &key, Some(lease.token()));
                match backend.release(&lease).await {
                    Ok(held) => rec.released(&key, lease.token(), held),
                    Err(_) => rec.failed(Op::Release, &key, Some(lease.token())),
                }
            }
            grants
        }));
    }
    sleep(Duration::from_secs(1)).await;
    let leader = server.wait_leader(Duration::from_secs(10)).await.unwrap();
    server.kill(leader).unwrap();
    sleep(Duration::from_secs(2)).await;
    server.restart(leader).await.unwrap();
    let restarted_at = Instant::now();
    let patience = Instant::now() + Duration::from_secs(15);
    sleep(Duration::from_secs(1)).await;
    while last_grant
        .lock()
        .unwrap()
        .is_none_or(|at| at <= restarted_at)
        && Instant::now() < patience
    {
        sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut grants = 0;
    for task in tasks {
        grants += task.await.unwrap();
    }
    let report = history.check();
    println!("shared contention with a leader kill: {}", report.summary());
    assert!(report.is_exclusive(), "{}", report.summary());
    assert!(report.is_safe_with_fencing(), "{}", report.summary());
    assert!(report.max_concurrent_readers >= 2, "{}", report.summary());
    assert!(report.max_permits_held <= 2, "{}", report.summary());
    assert!(
        last_grant
            .lock()
            .unwrap()
            .is_some_and(|at| at > restarted_at),
        "no grant after the leader came back"
    );
    assert!(grants > 50, "only {grants} grants");
}
