//! Interoperation with the real Apache Curator recipes (Debian's
//! `libcurator-recipes-java`): a small Java program (`tests/curator/
//! CuratorPeer.java`) is compiled with `javac` against the installed jars
//! and run as a process taking commands on stdin. Curator's
//! `InterProcessReadWriteLock` on [`ZkBackend::rwlock_path`] and ours on
//! the same key exclude each other in both directions (write/write,
//! write/read, reads share, writer preference, downgrade), Curator's
//! `InterProcessSemaphoreV2` on [`ZkBackend::semaphore_path`] and ours never
//! hold more than the limit together, and a killed Curator holder is freed
//! when its session expires. Missing Java or jars fail these tests (never a
//! skip) with the Debian package to install.

mod common;
#[path = "curator/election.rs"]
mod election;
#[path = "curator/peer.rs"]
mod peer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TTL, key, permits, refused, soon, spawn_acquire, spawn_wait, take};
use lock_core::{
    ErrorKind, LeaseKind, ListQuery, LockBackend, LockBackendExt, LockKey, LockShape, OwnerId,
};
use lock_zk::ZkBackend;
use peer::{Peer, setup};
use tokio::time::{Instant, sleep, timeout};

/// Curator's `InterProcessMutex` and our mutex on the same path exclude
/// each other in both directions (single try and short wait refused, the
/// waiter granted after the release), on the default layout
/// ([`ZkBackend::key_path`]) and on Curator's own path (`layout=path`).
/// `inspect` reports our holder details beside Curator, none for Curator's
/// own node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_mutex_and_ours_exclude_each_other() {
    let (target, bs, peer) = setup(1).await;
    let on_path = target
        .backend_with("layout=path", "path-layout backend")
        .await;
    let default_key = key("curator-mutex");
    let path_key =
        LockKey::new(format!("/curator-app/locks/{}", default_key.as_str())).expect("key");
    for (ours, k) in [(&bs[0], &default_key), (&on_path, &path_key)] {
        let path = ours.key_path(k);
        let mutex = |wait: u64| format!("mutex {path} {wait}");
        // Curator holds: ours is refused, then granted after its release.
        let (mut held, answer) = peer.take(&mutex(5_000)).await;
        assert_eq!(answer, "ok", "Curator on a free {path}");
        // Curator's node (its client's IP as data) has no holder details.
        let theirs = ours.inspect(k).await.unwrap().expect("Curator holds");
        assert_eq!(theirs.details, None, "{theirs:?}");
        assert!(
            ours.try_acquire(k, TTL).await.unwrap().is_none(),
            "our try beside Curator's mutex on {path}"
        );
        let err = ours.acquire(k, TTL, soon(300)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
        let waiter = spawn_acquire(ours, k);
        sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        peer.release(&mut held).await;
        let (granted_at, lease) = waiter.await.unwrap();
        let lease = lease.expect("ours after Curator's release");
        assert!(
            granted_at >= released,
            "ours granted before Curator released"
        );
        // Ours holds, with holder details in the node's data: Curator is
        // refused, then granted after our release.
        let info = ours.inspect(k).await.unwrap().expect("ours holds");
        assert_eq!(
            info.details.map(|d| d.pid),
            Some(std::process::id()),
            "our details on {path}"
        );
        for wait in [0, 300] {
            let (_busy, answer) = peer.take(&mutex(wait)).await;
            assert_eq!(
                answer, "busy",
                "Curator (wait {wait} ms) beside ours on {path}"
            );
        }
        let mut waiting = peer.acquire(&mutex(10_000)).await;
        assert!(
            timeout(Duration::from_millis(300), waiting.answers.recv())
                .await
                .is_err(),
            "Curator answered while ours held {path}"
        );
        assert!(ours.release(&lease).await.unwrap());
        assert_eq!(waiting.answer(Duration::from_secs(5)).await, "ok");
        peer.release(&mut waiting).await;
        assert_eq!(ours.inspect(k).await.unwrap(), None);
    }
}

/// `nodes=kazoo` beside Curator's `InterProcessMutex`, measured: ours
/// still waits for Curator (Curator's `-lock-` node is one of our
/// contenders), but Curator sorts on the text after `lock-`, and a
/// kazoo-named node has none, so Curator sorts our *whole name*
/// (`<owner hex>__lock__…`) against its own 10 digits. That puts ours
/// after Curator's unless our owner id starts with about nine zero hex
/// digits: Curator takes the lock beside ours. The test predicts Curator's
/// answer from that rule and checks it, so `nodes=kazoo` is documented as
/// for kazoo fleets and the default names for Curator fleets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_mutex_misorders_kazoo_named_nodes() {
    let (target, _bs, peer) = setup(0).await;
    let ours = target
        .backend_with("layout=path&nodes=kazoo", "kazoo-named backend")
        .await;
    let k = LockKey::new(format!(
        "/curator-app/locks/kazoo-named-{}",
        &OwnerId::random().to_hex()[..8]
    ))
    .expect("key");
    let path = k.as_str().to_owned();
    let mutex = |wait: u64| format!("mutex {path} {wait}");
    // Curator holds: ours is refused, and granted after its release.
    let (mut held, answer) = peer.take(&mutex(5_000)).await;
    assert_eq!(answer, "ok", "Curator on a free {path}");
    assert!(
        ours.try_acquire(&k, TTL).await.unwrap().is_none(),
        "kazoo-named ours beside Curator's mutex on {path}"
    );
    let err = ours.acquire(&k, TTL, soon(300)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    peer.release(&mut held).await;
    let lease = ours
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("ours after Curator's release");
    // Ours holds: Curator's next node gets the next sequence number, and
    // Curator compares our whole name with its digits.
    let node = ours.node_path(&lease).expect("our node");
    let name = node.rsplit('/').next().expect("name");
    let (_, seq) = name.split_once("__lock__").expect("a kazoo-named node");
    let curator_sort_key = format!("{:010}", seq.parse::<u64>().expect("sequence") + 1);
    let curator_waits = *name < *curator_sort_key.as_str();
    let (mut beside, answer) = peer.take(&mutex(0)).await;
    println!(
        "Curator's single try while kazoo-named ours ({name}) held: {answer} \
         (predicted {})",
        if curator_waits { "busy" } else { "ok" }
    );
    assert_eq!(
        answer == "busy",
        curator_waits,
        "Curator's answer {answer:?} beside {name}: not what its sort predicts"
    );
    if answer == "ok" {
        peer.release(&mut beside).await;
    }
    assert!(ours.release(&lease).await.unwrap());
    assert_eq!(ours.inspect(&k).await.unwrap(), None);
}

/// Write vs write, write vs read, reads share, writer preference and
/// downgrade, between Curator's `InterProcessReadWriteLock` and ours on
/// the same path, in both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_read_write_lock_and_ours_exclude_each_other() {
    let (_target, bs, peer) = setup(2).await;
    let k = key("curator-rw");
    let path = bs[0].rwlock_path(&k);
    let read = |wait: u64| format!("read {path} {wait}");
    let write = |wait: u64| format!("write {path} {wait}");

    // Curator's writer excludes our writers and readers.
    let (mut c1, answer) = peer.take(&write(5_000)).await;
    assert_eq!(answer, "ok");
    // Listed and reported as a writer, without details (Curator's node
    // holds its client's IP address).
    let theirs = bs[1].holders(&k, LockShape::ReadWrite).await.unwrap();
    let listed = bs[1]
        .list_shared(LockShape::ReadWrite, &ListQuery::new(k.as_str(), 10))
        .await
        .unwrap();
    let listed = listed.locks.iter().find(|l| l.key == k).expect("listed");
    assert_eq!(listed.holders, theirs);
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(theirs[0].kind, LeaseKind::Write);
    assert_eq!(theirs[0].details, None, "{theirs:?}");
    assert!(
        refused(&bs[0], &k, LeaseKind::Write).await,
        "our writer beside Curator's writer"
    );
    assert!(
        refused(&bs[0], &k, LeaseKind::Read).await,
        "our reader beside Curator's writer"
    );
    let ours = spawn_wait(&bs[0], &k, LeaseKind::Write);
    sleep(Duration::from_millis(300)).await;
    assert!(
        !ours.is_finished(),
        "our writer got in beside Curator's writer"
    );
    let released = Instant::now();
    peer.release(&mut c1).await;
    let (granted, w) = timeout(Duration::from_secs(5), ours)
        .await
        .unwrap()
        .unwrap();
    let w = w.expect("our writer after Curator's");
    assert!(granted >= released);

    // Our writer excludes Curator's writers and readers; Curator's waiting
    // reader gets in when we release.
    let (_, answer) = peer.take(&write(300)).await;
    assert_eq!(answer, "busy", "Curator's writer beside ours");
    let (_, answer) = peer.take(&read(300)).await;
    assert_eq!(answer, "busy", "Curator's reader beside our writer");
    let mut c2 = peer.acquire(&read(10_000)).await;
    sleep(Duration::from_millis(300)).await;
    assert!(
        c2.answers.try_recv().is_err(),
        "Curator's reader got in beside our writer"
    );
    assert!(bs[0].release(&w).await.unwrap());
    assert_eq!(c2.answer(Duration::from_secs(5)).await, "ok");

    // Reads share both ways; writers of either wait for all of them.
    let r = take(
        &bs[0],
        &k,
        LeaseKind::Read,
        "our reader beside Curator's reader",
    )
    .await;
    let (mut c3, answer) = peer.take(&read(300)).await;
    assert_eq!(answer, "ok", "Curator's reader beside ours");
    assert!(refused(&bs[1], &k, LeaseKind::Write).await);
    let (_, answer) = peer.take(&write(300)).await;
    assert_eq!(answer, "busy", "Curator's writer beside readers");

    // Writer preference across both: our waiting writer keeps Curator's new
    // readers out; then Curator's waiting writer keeps ours out.
    let ours = spawn_wait(&bs[1], &k, LeaseKind::Write);
    sleep(Duration::from_millis(300)).await;
    let (_, answer) = peer.take(&read(300)).await;
    assert_eq!(
        answer, "busy",
        "Curator's reader overtook our waiting writer"
    );
    peer.release(&mut c2).await;
    peer.release(&mut c3).await;
    assert!(!ours.is_finished());
    assert!(bs[0].release(&r).await.unwrap());
    let (_, w) = timeout(Duration::from_secs(5), ours)
        .await
        .unwrap()
        .unwrap();
    let w = w.expect("our writer");
    let mut c4 = peer.acquire(&write(10_000)).await;
    sleep(Duration::from_millis(300)).await;
    assert!(
        refused(&bs[0], &k, LeaseKind::Read).await,
        "our reader overtook Curator's waiting writer"
    );
    assert!(bs[1].release(&w).await.unwrap());
    assert_eq!(c4.answer(Duration::from_secs(5)).await, "ok");
    peer.release(&mut c4).await;

    // Our readers queue behind Curator's writer waiting on Curator's
    // reader (our read predicate sees Curator's write node).
    let (mut c7, answer) = peer.take(&read(300)).await;
    assert_eq!(answer, "ok");
    let mut c8 = peer.acquire(&write(10_000)).await;
    sleep(Duration::from_millis(300)).await;
    assert!(
        refused(&bs[0], &k, LeaseKind::Read).await,
        "our reader overtook Curator's writer waiting on Curator's reader"
    );
    peer.release(&mut c7).await;
    assert_eq!(c8.answer(Duration::from_secs(5)).await, "ok");
    peer.release(&mut c8).await;

    // Downgrade: Curator's waiting writer stays out until our read lease
    // goes, and Curator's new readers queue behind it.
    let w = take(&bs[0], &k, LeaseKind::Write, "w").await;
    let mut c5 = peer.acquire(&write(10_000)).await;
    sleep(Duration::from_millis(300)).await;
    let r = bs[0].downgrade(&w).await.expect("downgrade");
    sleep(Duration::from_millis(300)).await;
    assert!(
        c5.answers.try_recv().is_err(),
        "Curator's writer got in at our downgrade"
    );
    let (_, answer) = peer.take(&read(300)).await;
    assert_eq!(
        answer, "busy",
        "Curator's reader overtook Curator's waiting writer"
    );
    assert!(bs[0].release(&r).await.unwrap());
    assert_eq!(c5.answer(Duration::from_secs(5)).await, "ok");
    peer.release(&mut c5).await;

    // The check catches a layout that does not exclude: Curator's write
    // lock on our *mutex's* directory is ignored by our mutex recipe.
    let wrong = bs[0].key_path(&k);
    let (mut c6, answer) = peer.take(&format!("write {wrong} 1000")).await;
    assert_eq!(answer, "ok");
    let m = bs[0].try_acquire(&k, TTL).await.unwrap();
    assert!(m.is_some(), "expected the mismatched layout to let both in");
    bs[0].release(&m.unwrap()).await.unwrap();
    peer.release(&mut c6).await;
}

/// Curator's `InterProcessSemaphoreV2` and ours on the same path, under
/// contention: never more than the limit held together (observed from
/// both sides' holding intervals), and each side sees the other's permits.
/// The same check, with Curator told a larger limit (which our clients
/// cannot see), catches the excess.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_semaphore_and_ours_never_exceed_the_limit() {
    let (_target, bs, peer) = setup(3).await;
    let k = key("curator-sem");
    let path = bs[0].semaphore_path(&k);

    // Deterministic: Curator holds 2 of 3, ours gets the third, nobody more.
    let (mut c1, answer) = peer.take(&format!("sem {path} 5000 3 2")).await;
    assert_eq!(answer, "ok");
    let p = take(&bs[0], &k, permits(1, 3), "the third permit").await;
    assert!(refused(&bs[1], &k, permits(1, 3)).await, "a fourth permit");
    let (_, answer) = peer.take(&format!("sem {path} 300 3 1")).await;
    assert_eq!(answer, "busy", "Curator took a fourth permit");
    let mut c2 = peer.acquire(&format!("sem {path} 10000 3 1")).await;
    sleep(Duration::from_millis(300)).await;
    assert!(c2.answers.try_recv().is_err());
    assert!(bs[0].release(&p).await.unwrap());
    assert_eq!(c2.answer(Duration::from_secs(5)).await, "ok");
    peer.release(&mut c1).await;
    peer.release(&mut c2).await;

    // Contention: intervals from just after each grant to just before its
    // release request.
    let (peak, mixed) = sem_contention(&bs, &peer, &k, &path, 3, 3).await;
    println!("Curator + ours, limit 3: peak {peak}, Curator and ours overlapped: {mixed}");
    assert!(peak <= 3, "Curator and ours held {peak} of 3 permits");
    assert!(mixed, "Curator's and our permits never overlapped");

    // Curator told 5 while ours use 3 (our clients cannot see Curator's
    // limit): the same check sees more than 3, once deterministically and
    // once under contention.
    let k2 = key("curator-sem-mismatch");
    let path2 = bs[0].semaphore_path(&k2);
    let all = take(&bs[0], &k2, permits(3, 3), "3 of 3").await;
    let from = Instant::now();
    let (mut c3, answer) = peer.take(&format!("sem {path2} 1000 5 1")).await;
    assert_eq!(answer, "ok", "Curator with limit 5 beside our 3 of 3");
    let c_from = Instant::now();
    sleep(Duration::from_millis(20)).await;
    let history = vec![
        (false, from, Instant::now()),
        (false, from, Instant::now()),
        (false, from, Instant::now()),
        (true, c_from, Instant::now()),
    ];
    peer.release(&mut c3).await;
    assert!(bs[0].release(&all).await.unwrap());
    let (peak, _) = peak_of(&history);
    println!("Curator with limit 5 beside our 3 of 3: peak {peak}");
    assert!(peak > 3, "the check missed permits past the limit");
    let (peak, _) = sem_contention(&bs, &peer, &k2, &path2, 3, 5).await;
    println!("Curator with limit 5, ours with 3, under contention: peak {peak}");
}

/// Three of our tasks and three Curator workers take 1 permit at a time
/// for a while. Returns the peak permits held and whether a Curator
/// holding overlapped one of ours.
async fn sem_contention(
    bs: &[ZkBackend],
    peer: &Peer,
    k: &LockKey,
    path: &str,
    ours_limit: u32,
    curator_limit: u32,
) -> (usize, bool) {
    // (is Curator, from, to)
    let history: Arc<Mutex<Vec<(bool, Instant, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for (n, b) in bs.iter().enumerate() {
        let (b, k, history) = (b.clone(), k.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..8u64 {
                let lease = b
                    .acquire_kind(&k, permits(1, ours_limit), TTL, soon(20_000))
                    .await
                    .expect("our permit");
                let from = Instant::now();
                sleep(Duration::from_millis(20 + (n as u64 * 7 + round * 11) % 30)).await;
                history.lock().unwrap().push((false, from, Instant::now()));
                assert!(b.release(&lease).await.unwrap());
            }
        }));
    }
    let curator = async {
        let workers = (0..3u64).map(|n| {
            let history = history.clone();
            async move {
                for round in 0..8u64 {
                    let (mut req, answer) = peer
                        .take(&format!("sem {path} 20000 {curator_limit} 1"))
                        .await;
                    assert_eq!(answer, "ok");
                    let from = Instant::now();
                    sleep(Duration::from_millis(20 + (n * 13 + round * 7) % 30)).await;
                    history.lock().unwrap().push((true, from, Instant::now()));
                    peer.release(&mut req).await;
                }
            }
        });
        let mut joined = Vec::new();
        for w in workers {
            joined.push(w);
        }
        let [a, b, c]: [_; 3] = joined.try_into().ok().expect("three workers");
        tokio::join!(a, b, c);
    };
    curator.await;
    for t in tasks {
        t.await.expect("our worker");
    }
    let history = history.lock().unwrap().clone();
    peak_of(&history)
}

/// The most holders at one instant (each holding is one permit), and
/// whether Curator's and ours ever held at the same time.
fn peak_of(history: &[(bool, Instant, Instant)]) -> (usize, bool) {
    let mut peak = 0;
    let mut mixed = false;
    for (_, at, _) in history {
        let holding: Vec<&(bool, Instant, Instant)> = history
            .iter()
            .filter(|(_, f, t)| f <= at && at < t)
            .collect();
        peak = peak.max(holding.len());
        if holding.iter().any(|h| h.0) && holding.iter().any(|h| !h.0) {
            mixed = true;
        }
    }
    (peak, mixed)
}

/// A Curator holder killed with SIGKILL: its write lock and its permits
/// are freed when ZooKeeper expires its session (2 s), and ours get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_curator_holder_is_freed_at_session_expiry() {
    let (_target, bs, mut peer) = setup(1).await;
    let k = key("curator-crash");
    let rw = bs[0].rwlock_path(&k);
    let sem = bs[0].semaphore_path(&k);
    let (_w, answer) = peer.take(&format!("write {rw} 5000")).await;
    assert_eq!(answer, "ok");
    let (_p, answer) = peer.take(&format!("sem {sem} 5000 2 2")).await;
    assert_eq!(answer, "ok");
    assert!(refused(&bs[0], &k, LeaseKind::Read).await);
    assert!(refused(&bs[0], &k, permits(1, 2)).await);
    peer.child.start_kill().expect("kill the Curator peer");
    let killed = Instant::now();
    let (r, p) = tokio::join!(
        bs[0].acquire_kind(&k, LeaseKind::Read, TTL, soon(15_000)),
        bs[0].acquire_kind(&k, permits(2, 2), TTL, soon(15_000)),
    );
    let after = killed.elapsed();
    println!("ours granted {after:?} after Curator's holder was killed (session timeout 2 s)");
    let (r, p) = (
        r.expect("read after the crash"),
        p.expect("permits after the crash"),
    );
    assert!(after < Duration::from_secs(10));
    // Curator's writer does not store our epoch: the read token is the last
    // epoch one of ours wrote (none here).
    assert_eq!(r.token().get(), 0);
    assert!(bs[0].release(&r).await.unwrap());
    assert!(bs[0].release(&p).await.unwrap());
    let err = bs[0]
        .try_acquire_kind(&k, LeaseKind::Permits { count: 3, limit: 2 }, TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}
