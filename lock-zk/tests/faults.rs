//! Faults against a real ZooKeeper server started here: session expiry,
//! nodes and directories removed behind the driver's back, predecessors
//! that vanish between the list and the watch, local TTL enforcement,
//! key escaping, authentication and chroot, unreachable servers.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{SESSION_TIMEOUT, Standalone, grant, key};
use conformance::history::{History, Op};
use lock_core::{
    ErrorKind, Lease, LockBackend, LockBackendExt, LockClient, LockError, LockKey, LockState,
    SessionState,
};
use lock_zk::{ZkBackend, ZkConfig};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use zookeeper_client as zk;

/// A key `name` held by `a` (TTL 4 s) while `b` waits for it (up to
/// 30 s) on another session, with a raw client beside them.
struct HeldAndWaiting {
    a: ZkBackend,
    b: ZkBackend,
    raw: zk::Client,
    k: LockKey,
    /// The key's directory.
    dir: String,
    held: Lease,
    waiter: JoinHandle<Result<Lease, LockError>>,
    /// The nodes in `dir` once the waiter's is there, oldest first.
    children: Vec<String>,
}

async fn held_and_waiting(target: &Standalone, name: &str) -> HeldAndWaiting {
    let a = target.backend().await.expect("a");
    let b = target.backend().await.expect("b");
    let raw = target.raw().await;
    let k = key(name);
    let dir = a.key_path(&k);
    let held = grant(&a, &k, Duration::from_secs(4), "free").await;
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            b.acquire(
                &k,
                Duration::from_secs(4),
                Instant::now() + Duration::from_secs(30),
            )
            .await
        })
    };
    sleep(Duration::from_millis(500)).await;
    let mut children = raw.list_children(&dir).await.expect("list");
    children.sort_by_key(|name| name[name.len() - 10..].to_owned());
    HeldAndWaiting {
        a,
        b,
        raw,
        k,
        dir,
        held,
        waiter,
        children,
    }
}

/// The error `waiter` must end with within 5 s (`hung` when it does not end).
async fn waiter_error(waiter: JoinHandle<Result<Lease, LockError>>, hung: &str) -> LockError {
    timeout(Duration::from_secs(5), waiter)
        .await
        .expect(hung)
        .expect("waiter task")
        .expect_err("the waiter must fail")
}

/// The server is paused past the session timeout. The holder's guard
/// reports `Lost` before the waiter (on another session) is granted; a
/// lease's session signal reports the expiry by itself, without the server
/// coming back; afterwards the backend opens a new session and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_expiry_reports_lost_before_another_grant() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let a = target.backend().await.expect("a");
    let b = target.backend().await.expect("b");
    let session_a = a.session_id().expect("session");
    let k = key("expiry");
    let client = LockClient::new(a.clone());
    let guard = client
        .lock(k.as_str())
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .expect("guard");
    let first_token = guard.token();
    // A bare lease (no guard, no renewal) on another key, to watch the
    // session signal itself.
    let bare = grant(&a, &key("bare"), Duration::from_secs(2), "free").await;
    let mut bare_session = bare.session().expect("session signal").clone();
    let lost_at = {
        let mut states = guard.subscribe();
        tokio::spawn(async move {
            loop {
                if matches!(*states.borrow_and_update(), LockState::Lost(_)) {
                    return Instant::now();
                }
                if states.changed().await.is_err() {
                    return Instant::now();
                }
            }
        })
    };
    let waiter = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            let lease = b
                .acquire(
                    &k,
                    Duration::from_secs(2),
                    Instant::now() + Duration::from_secs(60),
                )
                .await?;
            Ok::<_, lock_core::LockError>((Instant::now(), lease))
        })
    };
    sleep(Duration::from_millis(500)).await;
    target.pause().await.expect("pause");
    let paused_at = Instant::now();
    let signal = timeout(SESSION_TIMEOUT * 3, async {
        loop {
            if let SessionState::Lost(reason) = bare_session.borrow_and_update().clone() {
                return reason;
            }
            bare_session.changed().await.expect("session signal");
        }
    })
    .await
    .expect("the session signal never reported the expiry while the server was paused");
    let signal_after = paused_at.elapsed();
    println!("session signal: Lost({signal}) {signal_after:?} after the pause");
    assert!(signal.contains("expired"), "{signal}");
    sleep((SESSION_TIMEOUT * 2).saturating_sub(signal_after)).await;
    target.resume().await.expect("resume");
    let (granted_at, lease_b) = timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter was never granted")
        .expect("waiter task")
        .expect("waiter acquire");
    let lost_at = timeout(Duration::from_secs(5), lost_at)
        .await
        .expect("guard never reported Lost")
        .expect("lost task");
    println!(
        "guard Lost {:?} after the pause; waiter granted {:?} after the pause",
        lost_at - paused_at,
        granted_at - paused_at
    );
    assert!(
        lost_at < granted_at,
        "the waiter was granted before the guard reported Lost"
    );
    assert!(lease_b.token() > first_token);
    assert!(matches!(a.session_state(), SessionState::Lost(_)));
    // The old lease is gone for good; the backend works on a new session.
    assert_eq!(a.renew(&bare).await.unwrap_err().kind(), ErrorKind::NotHeld);
    assert!(!a.release(&bare).await.expect("release of an expired lease"));
    assert!(b.release(&lease_b).await.expect("release b"));
    let again = a
        .try_acquire(&k, Duration::from_secs(2))
        .await
        .expect("try after expiry")
        .expect("free after expiry");
    assert_ne!(a.session_id(), Some(session_a), "a new session was opened");
    assert_eq!(a.session_state(), SessionState::Alive);
    assert!(again.token() > lease_b.token());
    assert!(a.release(&again).await.expect("release"));
    drop(guard);
}

/// A waiter whose own node is deleted by someone else stops waiting at
/// once with a clear error; the holder is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiter_node_deleted_externally_ends_the_wait() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let t = held_and_waiting(&target, "deleted").await;
    assert_eq!(t.children.len(), 2, "{:?}", t.children);
    let started = Instant::now();
    t.raw
        .delete(&format!("{}/{}", t.dir, t.children[1]), None)
        .await
        .expect("delete the waiter's node");
    let err = waiter_error(
        t.waiter,
        "the waiter kept waiting after its node was deleted",
    )
    .await;
    println!(
        "waiter ended {:?} after its node was deleted: {err}",
        started.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(err.to_string().contains("deleted"), "{err}");
    let info =
        t.b.inspect(&t.k)
            .await
            .expect("inspect")
            .expect("still held");
    assert_eq!(info.token, Some(t.held.token()));
    assert!(t.a.release(&t.held).await.expect("release"));
    let next = grant(&t.b, &t.k, Duration::from_secs(4), "free after release").await;
    assert!(t.b.release(&next).await.expect("release"));
}

/// The key's directory is removed (with every node in it) while a holder
/// holds and a waiter waits: the waiter ends with a clear error, the holder
/// learns the lease is gone, and the key works again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parent_removed_under_holder_and_waiter() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let t = held_and_waiting(&target, "parent").await;
    // Waiter first, so the holder's deletion does not wake it early.
    for name in t.children.iter().rev() {
        t.raw
            .delete(&format!("{}/{name}", t.dir), None)
            .await
            .expect("delete node");
    }
    t.raw
        .delete(&t.dir, None)
        .await
        .expect("delete the directory");
    let err = waiter_error(t.waiter, "the waiter hung after the directory was removed").await;
    println!("waiter: {err}");
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(
        err.to_string().contains("deleted") || err.to_string().contains("removed"),
        "{err}"
    );
    assert_eq!(
        t.a.renew(&t.held).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert!(!t.a.release(&t.held).await.expect("release"));
    let again = grant(&t.b, &t.k, Duration::from_secs(4), "the key works again").await;
    assert!(
        again.token() > t.held.token(),
        "czxid tokens survive the directory's removal"
    );
    assert!(t.b.release(&again).await.expect("release"));
}

/// Foreign lock nodes appear and vanish in the key's directory all the
/// time (a Curator-style client that locks and unlocks at once), so waiters
/// keep meeting predecessors that are gone by the time they set their
/// watch. Every acquire still completes, and no two windows overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vanishing_predecessors_do_not_deadlock() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let backends = [
        Arc::new(target.backend().await.expect("a")),
        Arc::new(target.backend().await.expect("b")),
    ];
    let raw = target.raw().await;
    let k = key("flap");
    let dir = backends[0].key_path(&k);
    raw.mkdir(
        &dir,
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .expect("mkdir");
    let stop = Arc::new(AtomicBool::new(false));
    let flapper = {
        let (stop, dir) = (stop.clone(), dir.clone());
        tokio::spawn(async move {
            let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let mut flaps = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let prefix = format!("{dir}/_c_00000000-0000-0000-0000-{:012x}-lock-", flaps);
                let (_, seq) = raw
                    .create(&prefix, &[], &options)
                    .await
                    .expect("flap create");
                raw.delete(&format!("{prefix}{seq}"), None)
                    .await
                    .expect("flap delete");
                flaps += 1;
            }
            flaps
        })
    };
    let history = Arc::new(History::new());
    let mut tasks = Vec::new();
    for t in 0..4 {
        let backend = backends[t % 2].clone();
        let (k, rec) = (k.clone(), history.process());
        tasks.push(tokio::spawn(async move {
            for _ in 0..30 {
                rec.invoke(Op::Acquire, &k, None);
                let lease = backend
                    .acquire(
                        &k,
                        Duration::from_secs(4),
                        Instant::now() + Duration::from_secs(30),
                    )
                    .await?;
                rec.acquired(&k, lease.token(), lease.validity_deadline());
                sleep(Duration::from_millis(1)).await;
                rec.invoke(Op::Release, &k, Some(lease.token()));
                let held = backend.release(&lease).await?;
                rec.released(&k, lease.token(), held);
            }
            Ok::<(), lock_core::LockError>(())
        }));
    }
    for task in tasks {
        timeout(Duration::from_secs(90), task)
            .await
            .expect("deadlock: a task never finished")
            .expect("task")
            .expect("acquire/release");
    }
    stop.store(true, Ordering::SeqCst);
    let flaps = flapper.await.expect("flapper");
    let report = history.check();
    println!("{flaps} foreign nodes flapped; {}", report.summary());
    assert!(report.is_safe_with_fencing(), "{}", report.summary());
    assert_eq!(report.grants, 120);
}

/// A lease that nobody renews has its node deleted by the backend that
/// granted it once its TTL has passed (the session itself lives on).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unrenewed_lease_is_freed_after_its_ttl() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let a = target.backend().await.expect("a");
    let b = target.backend().await.expect("b");
    let k = key("ttl");
    let ttl = Duration::from_secs(1);
    let started = Instant::now();
    let lease = grant(&a, &k, ttl, "free").await;
    let next = b
        .acquire(&k, ttl, started + ttl + Duration::from_millis(700))
        .await
        .expect("the key was not freed within its TTL");
    let freed = Instant::now();
    println!("freed {:?} after the grant (TTL {ttl:?})", freed - started);
    assert!(
        freed >= lease.validity_deadline(),
        "freed before the holder's deadline"
    );
    assert_eq!(
        a.renew(&lease).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    assert!(!a.release(&lease).await.expect("release"));
    assert!(b.inspect(&k).await.expect("inspect").is_some());
    assert!(b.release(&next).await.expect("release"));
}

/// The backend's one expiry task sleeps until the earliest deadline it
/// knows: a later grant with a shorter TTL must wake it, released leases
/// must not be deleted at their old deadline, and a renewed lease is kept
/// past its first one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shorter_ttl_after_a_long_one_is_still_enforced() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let a = target.backend().await.expect("a");
    let b = target.backend().await.expect("b");
    // Arms the task far out, then is released (its queue entry stays).
    let long = grant(&a, &key("ttl-long"), Duration::from_secs(30), "free").await;
    let held = grant(&a, &key("ttl-held"), Duration::from_secs(30), "free").await;
    assert!(a.release(&long).await.expect("release"));
    // A renewed lease outlives its first deadline.
    let ttl = Duration::from_millis(800);
    let renewed_key = key("ttl-renewed");
    let renewed = grant(&a, &renewed_key, ttl, "free").await;
    let k = key("ttl-short");
    let started = Instant::now();
    let short = grant(&a, &k, ttl, "free").await;
    let renewer = {
        let a = a.clone();
        let renewed = renewed.clone();
        tokio::spawn(async move {
            for _ in 0..6 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                a.renew(&renewed).await.expect("renew");
            }
        })
    };
    let next = b
        .acquire(&k, ttl, started + ttl + Duration::from_millis(700))
        .await
        .expect("the short-TTL key was not freed within its TTL");
    assert!(Instant::now() >= short.validity_deadline());
    assert!(b.release(&next).await.expect("release"));
    renewer.await.expect("renewer");
    // Still ours: renewed past its first deadline twice over.
    assert!(a.renew(&renewed).await.is_ok());
    assert!(
        b.try_acquire(&renewed_key, ttl)
            .await
            .expect("try")
            .is_none()
    );
    assert!(a.renew(&held).await.is_ok());
    assert!(a.release(&renewed).await.expect("release"));
    assert!(a.release(&held).await.expect("release"));
}

/// Odd keys map to distinct directories, all inside the lock root.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn odd_keys_stay_inside_the_root_and_do_not_collide() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let a = target.backend().await.expect("a");
    let raw = target.raw().await;
    let names = [
        "/",
        ".",
        "..",
        "zookeeper",
        "a/b",
        "a%2Fb",
        "../..",
        "ünïcode key",
        "-",
        "_c_x-lock-1",
    ];
    let mut leases = Vec::new();
    for name in names {
        let k = LockKey::new(name).expect("key");
        let lease = a
            .try_acquire(&k, Duration::from_secs(4))
            .await
            .expect("try")
            .unwrap_or_else(|| panic!("{name:?} collided with another key"));
        leases.push(lease);
    }
    let dirs = raw.list_children("/distlock").await.expect("list root");
    for name in names {
        let dir = a.key_path(&LockKey::new(name).expect("key"));
        let component = dir.strip_prefix("/distlock/").expect("inside the root");
        assert!(
            dirs.iter().any(|d| d == component),
            "{dir} missing in {dirs:?}"
        );
    }
    let top = raw.list_children("/").await.expect("list /");
    assert!(
        top.iter().all(|n| n == "distlock" || n == "zookeeper"),
        "{top:?}"
    );
    for lease in &leases {
        assert!(a.release(lease).await.expect("release"));
    }
}

/// Digest authentication, a chroot created on demand, and Curator's node
/// layout: an unauthenticated client cannot delete our node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn digest_auth_chroot_and_node_layout() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let url = format!(
        "zk://app:s3cret@{}/apps/one?session_timeout=4s&root=/locks",
        target.base_url().trim_start_matches("zk://")
    );
    let a = lock_zk::connect(&url)
        .await
        .expect("connect with digest and chroot");
    assert!(!format!("{a:?}").contains("s3cret"));
    let k = key("auth");
    let lease = grant(&a, &k, Duration::from_secs(4), "free").await;
    let hosts = target.base_url().trim_start_matches("zk://").to_owned();
    let raw = zk::Client::connector()
        .with_auth("digest", b"app:s3cret")
        .connect(&hosts)
        .await
        .expect("raw client as the same user");
    let stranger = target.raw().await;
    let dir = format!("/apps/one{}", a.key_path(&k));
    assert!(dir.starts_with("/apps/one/locks/"), "{dir}");
    let children = raw.list_children(&dir).await.expect("list");
    assert_eq!(children.len(), 1);
    let name = &children[0];
    let uuid = &name[3..39];
    assert!(
        name.starts_with("_c_") && name[39..].starts_with("-lock-"),
        "{name}"
    );
    assert_eq!(uuid.replace('-', ""), lease.owner().to_hex(), "{name}");
    assert_eq!(name[45..].len(), 10, "{name}");
    let (_, stat) = raw.get_data(&format!("{dir}/{name}")).await.expect("stat");
    assert_eq!(u64::try_from(stat.czxid).ok(), Some(lease.token().get()));
    let (acls, _) = raw.get_acl(&format!("{dir}/{name}")).await.expect("acl");
    assert!(acls.iter().all(|acl| acl.scheme() == "digest"), "{acls:?}");
    assert_eq!(
        stranger.delete(&format!("{dir}/{name}"), None).await,
        Err(zk::Error::NoAuth)
    );
    assert_eq!(stranger.list_children(&dir).await, Err(zk::Error::NoAuth));
    assert!(a.release(&lease).await.expect("release"));
}

/// Bad URLs and unreachable servers give typed errors in bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_and_misconfigured() {
    for url in [
        "zk://",
        "zk://127.0.0.1:0",
        "http://127.0.0.1:2181",
        "zk://h:1?x=1",
    ] {
        let err = lock_zk::connect(url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
    }
    let port = conformance::process::free_port().expect("port");
    let config = ZkConfig::from_url(&format!("zk://127.0.0.1:{port}"))
        .expect("config")
        .with_connect_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let err = ZkBackend::connect(config).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
}

/// While the server is paused (for less than the session timeout), every
/// call ends with a typed error in bounded time; after it resumes, nothing
/// the timed-out attempts may have created blocks the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_server_gives_typed_errors_in_bounded_time() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let config = ZkConfig::from_url(&format!(
        "{}?session_timeout=4s&timeout=500ms",
        target.base_url()
    ))
    .expect("config");
    let a = ZkBackend::connect(config).await.expect("a");
    let session = a.session_id();
    let k = key("paused");
    let warm = grant(&a, &k, Duration::from_secs(4), "free").await;
    assert!(a.release(&warm).await.expect("release"));
    target.pause().await.expect("pause");
    let transient =
        |e: &lock_core::LockError| matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable);
    let started = Instant::now();
    let err = a.try_acquire(&k, Duration::from_secs(4)).await.unwrap_err();
    println!("try_acquire: {:?}: {err}", started.elapsed());
    assert!(transient(&err), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1500));
    let started = Instant::now();
    let err = a
        .acquire(
            &k,
            Duration::from_secs(4),
            started + Duration::from_millis(700),
        )
        .await
        .unwrap_err();
    println!("acquire: {:?}: {err}", started.elapsed());
    assert!(
        transient(&err) || err.kind() == ErrorKind::Contended,
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_millis(1500));
    let started = Instant::now();
    let err = a.inspect(&k).await.unwrap_err();
    assert!(transient(&err), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1500));
    target.resume().await.expect("resume");
    let lease = a
        .acquire(
            &k,
            Duration::from_secs(4),
            Instant::now() + Duration::from_secs(15),
        )
        .await
        .expect("a node left by a timed-out attempt blocks the key");
    println!("session kept: {}", a.session_id() == session);
    assert!(a.release(&lease).await.expect("release"));
}

/// A release whose connection breaks in flight is sent again once the
/// client has reconnected, within the operation timeout: the server
/// stalls (SIGSTOP) past the client's liveness limit (3/5 of a 4 s
/// session: "no response from connection in 2400ms"), then answers again
/// within the session. The lock is freed at once instead of being left to
/// the session's end; before, the release failed with `Unavailable` and
/// the key stayed held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_rides_out_a_broken_connection() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let url = format!("{}?session_timeout=4s&timeout=8s", target.base_url());
    let a = Arc::new(
        ZkBackend::connect(ZkConfig::from_url(&url).expect("config"))
            .await
            .expect("a"),
    );
    let k = key("broken-release");
    let held = grant(&a, &k, Duration::from_secs(30), "free").await;
    target.pause().await.expect("pause");
    let release = tokio::spawn({
        let a = a.clone();
        async move { a.release(&held).await }
    });
    sleep(Duration::from_millis(3000)).await;
    target.resume().await.expect("resume");
    let released = release.await.expect("release task");
    println!("release across a broken connection: {released:?}");
    assert!(released.is_ok(), "{released:?}");
    let b = ZkBackend::connect(ZkConfig::from_url(&url).expect("config"))
        .await
        .expect("b");
    let next = b
        .try_acquire(&k, Duration::from_secs(5))
        .await
        .expect("try");
    assert!(next.is_some(), "the released key is still held");
}

/// Guards renewed in one batch (`renew_many`: a `sync` and a node check
/// per lease): the one whose node an administrator deletes goes `Lost`
/// within a renewal interval (plus a request), the others stay held. A
/// batch renewal that never looks at the nodes fails the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_node_is_noticed_by_batched_renewals() {
    let Some(target) = Standalone::start().await else {
        return;
    };
    let backend = target.backend().await.expect("backend");
    let raw = target.raw().await;
    let held = Arc::new(backend.clone()) as Arc<dyn LockBackend>;
    deleted_node_is_noticed(held, &backend, &raw)
        .await
        .expect("the driver's batched renewals");
    let blind = Arc::new(BlindRenewals(backend.clone())) as Arc<dyn LockBackend>;
    let err = deleted_node_is_noticed(blind, &backend, &raw)
        .await
        .expect_err("the check missed renewals that never look at the nodes");
    println!("blind renewals: {err}");
}

/// Holds 5 locks through `client_backend`, deletes one node behind its
/// back and checks that exactly that guard goes `Lost` within one renewal
/// interval and a request.
async fn deleted_node_is_noticed(
    client_backend: Arc<dyn LockBackend>,
    backend: &ZkBackend,
    raw: &zk::Client,
) -> Result<(), String> {
    let ttl = Duration::from_secs(3);
    let client = LockClient::from_arc(client_backend);
    let mut guards = Vec::new();
    for i in 0..5 {
        let k = key(&format!("batch-{i}"));
        let guard = client
            .lock(k.as_str())
            .ttl(ttl)
            .acquire()
            .await
            .map_err(|e| e.to_string())?;
        guards.push(guard);
    }
    // Let one batch renewal pass, so the guards renew together.
    sleep(ttl / 2).await;
    let victim = &guards[2];
    let path = backend.node_path(&victim.lease()).expect("node path");
    raw.delete(&path, None).await.expect("delete the node");
    let deleted = Instant::now();
    // Renewed every third of the TTL: the next renewal sees it.
    let bound = ttl / 3 + Duration::from_secs(1);
    let noticed = timeout(bound, victim.lost()).await;
    let others_held = guards
        .iter()
        .enumerate()
        .all(|(i, g)| i == 2 || g.is_held());
    let result = match noticed {
        Ok(reason) => {
            println!("lost {:?} after the delete: {reason}", deleted.elapsed());
            if others_held {
                Ok(())
            } else {
                Err("a guard whose node was not touched was lost too".to_owned())
            }
        }
        Err(_) => Err(format!(
            "the guard whose node was deleted still reported {:?} {bound:?} later",
            victim.state()
        )),
    };
    for guard in guards {
        let _ = guard.release().await;
    }
    result
}

/// Broken: renews every lease in a batch without looking at its node.
#[derive(Debug)]
struct BlindRenewals(ZkBackend);

#[lock_core::async_trait]
impl lock_core::LockWrapper for BlindRenewals {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    fn name(&self) -> &'static str {
        "zookeeper-blind-renewals"
    }
    async fn renew_many(
        &self,
        leases: &[&lock_core::Lease],
    ) -> Vec<Result<Instant, lock_core::LockError>> {
        let now = Instant::now();
        leases.iter().map(|l| Ok(now + l.ttl() / 2)).collect()
    }
}
