//! lock-etcd against real etcd servers started by the harness: the shared
//! conformance suite (on the `etcd` and `etcd-cluster` deployments of
//! `conformance::deploy`: a single member and a 3-member cluster), a contention
//! run with the leader killed and restarted, interop with `etcdctl lock`,
//! and session loss.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use conformance::deploy::{self, DeployedTarget};
use conformance::history::{FencedResource, History};
use conformance::servers::etcd::EtcdServer;
use conformance::{Harness, OrSkip, SuiteConfig, run_suite};
use lock_core::LockBackendExt;
use lock_core::{ErrorKind, LockBackend, LockClient, LockKey, LockState};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::{Instant, sleep, timeout};

mod common;
use common::{connect_for, granted};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_single_member() {
    let Some(deployment) = deploy::start("etcd").await.or_skip() else {
        return;
    };
    let target = DeployedTarget::new(deployment, common::suite_opener());
    let report = run_suite(&Harness::new(Arc::new(target))).await;
    println!("{}", report.table());
    report.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_three_member_cluster() {
    let Some(deployment) = deploy::start("etcd-cluster").await.or_skip() else {
        return;
    };
    let target = DeployedTarget::new(deployment, common::suite_opener());
    let harness = Harness::with_config(
        Arc::new(target),
        SuiteConfig {
            fencing_grants: 1000,
            ..SuiteConfig::default()
        },
    );
    let report = run_suite(&harness).await;
    println!("{}", report.table());
    report.assert_passed();
}

/// 8 tasks over 2 clients contend on one key of a 3-member cluster while
/// the leader is killed and restarted, then a follower: the history shows
/// no overlapping grants, tokens strictly increase, a fenced resource
/// rejects nothing, and grants continue after each fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_contention_survives_leader_kill_and_restart() {
    let Some(mut server) = EtcdServer::start_cluster(3).await.or_skip() else {
        return;
    };
    let session_ttl = Duration::from_secs(2);
    let clients = [
        Arc::new(connect_for(&server, "chaos", session_ttl).await),
        Arc::new(connect_for(&server, "chaos", session_ttl).await),
    ];
    let key = LockKey::new("contended").unwrap();
    let history = Arc::new(History::new());
    let resource = Arc::new(FencedResource::new());
    let stop = Arc::new(AtomicBool::new(false));
    let last_grant = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let backend = clients[t % 2].clone();
        let rec = history.process();
        let (key, resource, stop, last_grant) = (
            key.clone(),
            resource.clone(),
            stop.clone(),
            last_grant.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut grants = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let deadline = Instant::now() + Duration::from_secs(10);
                let acquire = backend.acquire(&key, Duration::from_secs(2), deadline);
                let Some(lease) = common::recorded_acquire(&rec, &key, acquire).await else {
                    continue;
                };
                rec.acquired(&key, lease.token(), lease.validity_deadline());
                grants.push((Instant::now(), lease.token()));
                *last_grant.lock().unwrap() = Some(Instant::now());
                resource.write(&rec, &key, lease.token(), |v| *v += 1);
                sleep(Duration::from_millis(2)).await;
                common::recorded_release(&rec, &*backend, &key, &lease).await;
            }
            grants
        }));
    }
    let mut faults = Vec::new();
    sleep(Duration::from_secs(1)).await;
    let leader = server.wait_leader(Duration::from_secs(10)).await.unwrap();
    server.kill(leader).unwrap();
    let killed_at = Instant::now();
    faults.push(("leader killed", killed_at));
    sleep(Duration::from_secs(2)).await;
    server.restart(leader).await.unwrap();
    faults.push(("leader restarted", Instant::now()));
    sleep(Duration::from_secs(1)).await;
    let leader = server.wait_leader(Duration::from_secs(10)).await.unwrap();
    let follower = (leader + 1) % server.len();
    server.kill(follower).unwrap();
    faults.push(("follower killed", Instant::now()));
    sleep(Duration::from_secs(1)).await;
    server.restart(follower).await.unwrap();
    let restarted_at = Instant::now();
    faults.push(("follower restarted", restarted_at));
    // Grants must resume: wait for one after the last fault (elections take
    // longer on a loaded machine), bounded.
    sleep(Duration::from_secs(1)).await;
    let patience = Instant::now() + Duration::from_secs(15);
    common::await_grant_after(&last_grant, restarted_at, patience).await;
    stop.store(true, Ordering::SeqCst);
    let mut grants = Vec::new();
    for task in tasks {
        grants.extend(task.await.unwrap());
    }
    let report = history.check();
    println!("cluster contention: {}", report.summary());
    assert!(report.is_exclusive(), "overlap: {}", report.summary());
    assert!(report.is_safe_with_fencing(), "{}", report.summary());
    assert_eq!(
        resource.rejected(),
        0,
        "the fenced resource rejected writes"
    );
    grants.sort();
    assert!(
        grants.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens do not strictly increase in grant order"
    );
    for (what, at) in &faults {
        assert!(grants.iter().any(|(g, _)| g > at), "no grant after {what}");
    }
    assert!(grants.len() > 50, "only {} grants", grants.len());
}

/// Our client and `etcdctl lock` on the same name exclude each other, in
/// both directions, and hand over through the watch (well before any TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_with_etcdctl_lock() {
    let Some((server, etcdctl)) = common::server_and_etcdctl().await else {
        return;
    };
    let endpoint = format!("--endpoints={}", server.endpoints().join(","));
    let backend = connect_for(&server, "interop", Duration::from_secs(5)).await;
    let key = LockKey::new("job").unwrap();
    let name = backend.key_prefix(&key).trim_end_matches('/').to_owned();
    assert_eq!(name, "interop/job");

    // 1. etcdctl holds: we are excluded, then get it when it lets go.
    let mut holder = Command::new(&etcdctl)
        .args([endpoint.as_str(), "lock", name.as_str()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let held_key = timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("etcdctl lock did not acquire")
        .unwrap()
        .unwrap();
    assert!(held_key.starts_with("interop/job/"), "{held_key}");
    assert!(
        backend
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    let err = backend
        .acquire(
            &key,
            Duration::from_secs(5),
            Instant::now() + Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended);
    let info = backend.inspect(&key).await.unwrap().unwrap();
    assert_eq!(format!("interop/job/{}", info.holder), held_key);
    let waiter = {
        let backend = backend.clone();
        let key = key.clone();
        tokio::spawn(async move {
            backend
                .acquire(
                    &key,
                    Duration::from_secs(5),
                    Instant::now() + Duration::from_secs(20),
                )
                .await
        })
    };
    let why = "granted while etcdctl held the lock";
    common::assert_waiting(&waiter, Duration::from_millis(300), why).await;
    let signalled = Instant::now();
    // SIGTERM: etcdctl unlocks on a signal.
    let pid = libc::pid_t::try_from(holder.id().unwrap()).unwrap();
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let lease = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("not granted after etcdctl unlocked")
        .unwrap()
        .unwrap();
    let handoff = signalled.elapsed();
    // etcdctl's session TTL is 10 s: a grant this early came from the watch.
    assert!(handoff < Duration::from_secs(3), "handoff took {handoff:?}");
    let _ = holder.wait().await;
    println!("etcdctl -> us handoff: {handoff:?}");

    // 2. We hold: `etcdctl lock` waits until we release.
    let mut contender = Command::new(&etcdctl)
        .args([endpoint.as_str(), "lock", name.as_str(), "echo", "got-it"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(contender.stdout.take().unwrap()).lines();
    assert!(
        timeout(Duration::from_secs(1), out.next_line())
            .await
            .is_err(),
        "etcdctl got the lock while we held it"
    );
    let released_at = Instant::now();
    assert!(backend.release(&lease).await.unwrap());
    let line = timeout(Duration::from_secs(5), out.next_line())
        .await
        .expect("etcdctl did not get the lock after our release")
        .unwrap()
        .unwrap();
    assert_eq!(line, "got-it");
    println!("us -> etcdctl handoff: {:?}", released_at.elapsed());
    assert!(contender.wait().await.unwrap().success());
}

/// Pausing the server past the session TTL: the holder's guard reports
/// `Lost` before another client is granted the key, the grant has a larger
/// token, and the first backend starts a new session for later acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_loss_is_signalled_before_another_grant() {
    let Some(mut server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let a = connect_for(&server, "session", ttl).await;
    let b = connect_for(&server, "session", ttl).await;
    let first_session = a.session_lease(ttl).unwrap();
    let key = LockKey::new("paused").unwrap();
    let client = LockClient::new(a.clone());
    let guard = client.lock(key.as_str()).ttl(ttl).acquire().await.unwrap();
    let first_token = guard.token();
    let mut state = guard.subscribe();
    let watcher = tokio::spawn(async move {
        let mut suspect_at = None;
        loop {
            match &*state.borrow_and_update() {
                LockState::Suspect => {
                    suspect_at.get_or_insert_with(Instant::now);
                }
                LockState::Lost(_) => return (suspect_at, Instant::now()),
                _ => {}
            }
            if state.changed().await.is_err() {
                return (suspect_at, Instant::now());
            }
        }
    });
    sleep(Duration::from_millis(400)).await;
    let deadline_before = guard.validity_deadline();
    server.member(0).process().pause().unwrap();
    let paused_at = Instant::now();
    sleep(ttl * 3).await;
    server.member(0).process().resume().unwrap();
    let next = b
        .acquire(&key, ttl, Instant::now() + Duration::from_secs(10))
        .await
        .unwrap();
    let granted_at = Instant::now();
    let (suspect_at, lost_at) = watcher.await.unwrap();
    println!(
        "paused at 0; suspect at {:?}; lost at {:?}; deadline {:?}; granted to b at {:?}",
        suspect_at.map(|s| s - paused_at),
        lost_at - paused_at,
        deadline_before.saturating_duration_since(paused_at),
        granted_at - paused_at
    );
    assert!(suspect_at.is_some(), "no Suspect before Lost");
    assert!(lost_at < granted_at, "lost signal after the next grant");
    assert!(
        lost_at <= guard.validity_deadline() + Duration::from_millis(100),
        "lost signal late"
    );
    assert!(next.token() > first_token);
    assert!(matches!(guard.state(), LockState::Lost(_)));
    // The next acquire on `a` uses a new session.
    let other = LockKey::new("after").unwrap();
    let lease = granted(&a, &other, ttl).await;
    assert_ne!(a.session_lease(ttl).unwrap(), first_session);
    assert!(a.release(&lease).await.unwrap());
    assert!(b.release(&next).await.unwrap());
}

/// Two grants of one key from the same backend (one session, one lease)
/// exclude each other; the second entry gets a suffixed name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_backend_grants_exclude_each_other() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let backend = connect_for(&server, "same", ttl).await;
    let key = LockKey::new("k").unwrap();
    let first = granted(&backend, &key, ttl).await;
    let lease_hex = backend.session_lease(ttl).unwrap();
    // The session's plain entry, `same/k/<lease hex>` on the server: the
    // lease carries no name for it (its owner id names the session).
    assert_eq!(first.backend_data(), "");
    assert_eq!(
        backend.inspect(&key).await.unwrap().unwrap().holder,
        lease_hex
    );
    assert!(backend.try_acquire(&key, ttl).await.unwrap().is_none());
    let waiter = {
        let (backend, key) = (backend.clone(), key.clone());
        tokio::spawn(async move {
            backend
                .acquire(&key, ttl, Instant::now() + Duration::from_secs(10))
                .await
        })
    };
    let why = "second grant while the first is held";
    common::assert_waiting(&waiter, Duration::from_millis(300), why).await;
    assert!(backend.release(&first).await.unwrap());
    let second = waiter.await.unwrap().unwrap();
    assert!(second.backend_data().starts_with(&format!("{lease_hex}-")));
    assert!(second.token() > first.token());
    // `a` and `a/b` are different locks (no prefix overlap).
    let parent = LockKey::new("a").unwrap();
    let child = LockKey::new("a/b").unwrap();
    let p = granted(&backend, &parent, ttl).await;
    let c = granted(&backend, &child, ttl).await;
    assert_eq!(
        backend.inspect(&parent).await.unwrap().unwrap().token,
        Some(p.token())
    );
    assert!(backend.release(&c).await.unwrap());
    assert!(backend.release(&p).await.unwrap());
    assert!(backend.release(&second).await.unwrap());
    // close() revokes the session: a held lock is freed at once.
    let held = granted(&backend, &key, ttl).await;
    backend.close().await.unwrap();
    let other = connect_for(&server, "same", ttl).await;
    assert!(other.try_acquire(&key, ttl).await.unwrap().is_some());
    assert!(!other.release(&held).await.unwrap());
}

/// Acquires dropped at every point of their create transaction (in
/// flight, answered, waiting) leave no entry behind, although the session
/// that would keep such an entry alive lives on: the pending entry's cleanup
/// takes over the create and deletes what it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_no_entry_behind() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let backend = connect_for(&server, "cancel", ttl).await;
    let holder = connect_for(&server, "cancel", ttl).await;
    let held = LockKey::new("held").unwrap();
    let held_lease = granted(&holder, &held, ttl).await;
    let keys: Vec<LockKey> = (0..4)
        .map(|i| LockKey::new(format!("free-{i}")).unwrap())
        .collect();
    let mut tasks = Vec::new();
    for i in 0..400_u64 {
        let backend = backend.clone();
        let key = if i % 5 == 0 {
            held.clone()
        } else {
            keys[usize::try_from(i).unwrap() % keys.len()].clone()
        };
        let cut = Duration::from_micros((i % 40) * 100);
        tasks.push(tokio::spawn(async move {
            let acquired = timeout(
                cut,
                backend.acquire(&key, ttl, Instant::now() + Duration::from_secs(5)),
            )
            .await;
            // A grant that completed before its cut is released: this test
            // is about the acquires that did not complete (a lease dropped
            // without a release is deleted at its own TTL, 30 s here).
            if let Ok(Ok(lease)) = acquired {
                let _ = backend.release(&lease).await;
            }
        }));
        if tasks.len() == 50 {
            for t in tasks.drain(..) {
                t.await.unwrap();
            }
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Pending entries are deleted by their cleanup at once.
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let left = common::raw_count(&backend, "cancel/").await;
        // Only the holder's entry may remain.
        if left == 1 {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "{} entries left behind by cancelled acquires",
            left - 1
        );
        sleep(Duration::from_millis(200)).await;
    }
    assert!(holder.release(&held_lease).await.unwrap());
    for key in std::iter::once(&held).chain(&keys) {
        let lease = backend.try_acquire(key, ttl).await.unwrap();
        assert!(lease.is_some(), "{key} still held");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_fails_fast_with_a_typed_error() {
    let port = conformance::process::free_port().unwrap();
    let config =
        EtcdConfig::new([format!("127.0.0.1:{port}")]).op_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = EtcdBackend::connect(config).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // A host without a port gets etcd's client port (2379) since 52594a1:
    // an unknown host is unreachable, not a configuration error.
    let err = lock_etcd::connect("etcd://nohost.invalid")
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
}
