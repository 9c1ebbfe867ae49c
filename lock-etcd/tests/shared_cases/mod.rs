//! The broken doubles of `tests/shared.rs` ([`Broken`]) and its tests,
//! which run each check there on a real etcd and on a double (moved out of
//! `tests/shared.rs`).

use super::*;
use lock_core::GrantRequest;

// ---------------------------------------------------------------- doubles

// The read-write and semaphore checks the conformance suite has
// (`readers_share_writers_exclude`, `writers_are_not_starved`,
// `downgrade_leaves_no_gap`, `permits_never_exceed_limit`,
// `semaphore_limits_are_checked`, `cancelled_share_waits_leave_nothing`)
// run there, with its own broken doubles; these are etcd's own.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Read grants report token 0.
    ReadTokenZero,
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

#[lock_core::async_trait]
impl lock_core::LockWrapper for Broken {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }
    fn name(&self) -> &'static str {
        "broken-etcd"
    }
    /// Mutexes are etcd's; the other kinds go through the flaw.
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        if request.kind == LeaseKind::Exclusive {
            return self.inner.grant(request).await;
        }
        let lease = self.inner.grant(request).await?;
        Ok(lease.map(|l| self.lease(l)))
    }
}

/// Removes what a broken double left on the server.
async fn wipe(raw: &EtcdBackend, key: &LockKey) {
    for tag in ["%rw/", "%sem/"] {
        crate::common::raw_delete(raw, format!("{PREFIX}/{}{tag}", key.as_str())).await;
    }
}

async fn shows_failure(name: &str, result: Check) {
    match result {
        Ok(()) => panic!("the check {name} passed on a broken double"),
        Err(why) => println!("{name} caught the broken double: {why}"),
    }
}

/// A real etcd, a backend on it and the same backend as a trait object.
struct Setup {
    server: EtcdServer,
    real: Arc<EtcdBackend>,
    b: Arc<dyn LockBackend>,
}

impl Setup {
    /// `None` when no etcd can be started here.
    async fn start() -> Option<Self> {
        let server = EtcdServer::start().await.or_skip()?;
        let real = backend(&server).await;
        let b: Arc<dyn LockBackend> = real.clone();
        Some(Self { server, real, b })
    }

    /// Runs `check` on the real backend (and its raw side) under a fresh
    /// key made from `name`: it must pass.
    async fn passes<F, Fut>(&self, name: &str, check: F)
    where
        F: FnOnce(Arc<dyn LockBackend>, Arc<EtcdBackend>, LockKey) -> Fut,
        Fut: std::future::Future<Output = Check>,
    {
        check(self.b.clone(), self.real.clone(), key(name))
            .await
            .unwrap();
    }

    /// Runs `check` on the real backend wrapped with `flaw`, under a fresh
    /// key made from `label` (`readers overlap` → `readers-overlap-broken`):
    /// the check `label` must fail. Then wipes what the double left.
    async fn fails<F, Fut>(&self, label: &str, flaw: Flaw, check: F)
    where
        F: FnOnce(Arc<dyn LockBackend>, Arc<EtcdBackend>, LockKey) -> Fut,
        Fut: std::future::Future<Output = Check>,
    {
        let k = key(&format!("{}-broken", label.replace(' ', "-")));
        let broken = Broken::wrap(self.real.clone(), flaw);
        shows_failure(label, check(broken, self.real.clone(), k.clone()).await).await;
        wipe(&self.real, &k).await;
    }

    /// [`Self::passes`] on etcd, then [`Self::fails`] with each
    /// `(label, flaw)` of `flaws`.
    async fn check<F, Fut>(&self, name: &str, check: F, flaws: &[(&str, Flaw)])
    where
        F: Fn(Arc<dyn LockBackend>, Arc<EtcdBackend>, LockKey) -> Fut,
        Fut: std::future::Future<Output = Check>,
    {
        self.passes(name, &check).await;
        for &(label, flaw) in flaws {
            self.fails(label, flaw, &check).await;
        }
    }
}

/// Another backend on `server` (1 s TTL) that takes `kind` on `key` and
/// drops the lease without releasing it; `holder` names it in a failure.
async fn holder_elsewhere(
    server: &EtcdServer,
    key: &LockKey,
    kind: LeaseKind,
    holder: &str,
) -> EtcdBackend {
    let other = EtcdBackend::connect(config(server, Duration::from_secs(1)))
        .await
        .expect("connect");
    let lease = other
        .try_acquire_kind(key, kind, Duration::from_secs(1))
        .await
        .expect(holder)
        .expect("granted");
    drop(lease);
    other
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_and_tokens() {
    let Some(s) = Setup::start().await else {
        return;
    };
    let (real, b) = (&s.real, &s.b);
    // Downgrade without a gap is the suite's `downgrade_leaves_no_gap`.
    let tokens_flaws = [("tokens", Flaw::ReadTokenZero)];
    s.check("tokens", check_tokens, &tokens_flaws).await;

    // Downgrade refuses a read lease, and a write lease whose entry was
    // deleted behind its back (which is then dead for renew too).
    let k = key("downgrade-refused");
    let read = granted(&**b, &k, LeaseKind::Read, "reader").await;
    assert_eq!(
        b.downgrade(&read).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert!(b.release(&read).await.unwrap());
    let write = granted(&**b, &k, LeaseKind::Write, "writer").await;
    crate::common::raw_delete(real, format!("{PREFIX}/{}%rw/", k.as_str())).await;
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
    let w = granted(&**b, &k, LeaseKind::Write, "writer beside a mutex").await;
    let p = granted(&**b, &k, permits(1, 1), "permit beside both").await;
    assert!(
        b.try_acquire(&k, TTL).await.unwrap().is_none(),
        "the mutex is still one"
    );
    for lease in [&m, &w, &p] {
        assert!(b.release(lease).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_and_cancelled_holders_free_their_share() {
    let Some(s) = Setup::start().await else {
        return;
    };
    let (server, real, b) = (&s.server, &s.real, &s.b);
    // A cancelled waiter leaving nothing is the suite's
    // `cancelled_share_waits_leave_nothing`.
    // A real crash: another backend takes the share and is dropped without
    // releasing (its keep-alive stops, nothing is revoked).
    let crash = |key: LockKey, kind: LeaseKind| async move {
        drop(holder_elsewhere(server, &key, kind, "crash holder").await);
    };
    check_crash_freed(b.clone(), key("crash"), crash)
        .await
        .unwrap();

    // A lease moved to another process by its handle is renewed and
    // released there.
    let k = key("handle");
    let read = granted(&**b, &k, LeaseKind::Read, "reader").await;
    let moved = Lease::from_handle(&read.to_handle()).expect("handle");
    assert_eq!(moved.kind(), LeaseKind::Read);
    let elsewhere = backend(server).await;
    elsewhere.renew(&moved).await.expect("renew elsewhere");
    let holders = elsewhere.holders(&k, LockShape::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].holder, read.owner().to_hex());
    assert!(holders[0].remaining_ttl.is_some());
    assert!(elsewhere.release(&moved).await.expect("release elsewhere"));
    assert!(!b.release(&read).await.unwrap(), "released twice");
    assert_eq!(raw_entries(real, &k, "%rw").await, 0);

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
    wipe(real, &k).await;
}

/// A stalled holder keeps its session alive but never renews: its share is
/// deleted by the session's expiry task at the end of its own TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_holder_share_expires_with_its_ttl() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let b: Arc<dyn LockBackend> = backend(&server).await;
    // A stalled holder: its process lives (the session lease is kept
    // alive) but it never renews: the share goes with its own TTL (the
    // session's expiry task deletes entries whose value is not a bare
    // owner id, too).
    let server = &server;
    let stall = |key: LockKey, kind: LeaseKind| async move {
        let other = holder_elsewhere(server, &key, kind, "stalled holder").await;
        // Never dropped: its keep-alive runs until the test ends.
        std::mem::forget(other);
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
    use conformance::history::History;
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
                let deadline = Instant::now() + Duration::from_secs(10);
                let acquire = backend.acquire_kind(&key, kind, TTL, deadline);
                let Some(lease) = crate::common::recorded_acquire(&rec, &key, acquire).await else {
                    continue;
                };
                rec.acquired_kind(&key, kind, lease.token(), lease.validity_deadline());
                grants += 1;
                *last_grant.lock().unwrap() = Some(Instant::now());
                sleep(Duration::from_millis(5)).await;
                crate::common::recorded_release(&rec, &*backend, &key, &lease).await;
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
    crate::common::await_grant_after(&last_grant, restarted_at, patience).await;
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
