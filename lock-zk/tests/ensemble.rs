//! A 3-member ZooKeeper ensemble on loopback: the shared suite, and a
//! contention run during which the leader is killed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{Servers, ZkTarget};
use conformance::history::{FencedResource, History, Op};
use conformance::{Harness, run_suite};
use lock_core::{LockBackend, LockKey, SessionState};
use tokio::time::{Instant, sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_on_an_ensemble() {
    let Some(target) = ZkTarget::ensemble().await else {
        return;
    };
    let harness = Harness::new(Arc::new(target));
    let report = run_suite(&harness).await;
    println!("{}", report.table());
    report.assert_passed();
}

/// Six tasks on three sessions contend for one key while the leader is
/// killed: no two promised windows overlap, tokens strictly increase, grants
/// continue after the election, and every session survives (it reconnects
/// within its timeout: same session id, state `Alive`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_during_contention() {
    let Some(target) = ZkTarget::ensemble().await else {
        return;
    };
    let backends: Vec<Arc<lock_zk::ZkBackend>> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(Arc::new(target.backend().await.expect("backend")));
        }
        out
    };
    let sessions_before: Vec<Option<i64>> = backends.iter().map(|b| b.session_id()).collect();
    let key = LockKey::new(format!("leader-kill-{}", std::process::id())).expect("key");
    let history = Arc::new(History::new());
    let resource = Arc::new(FencedResource::new());
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let grants_after_kill = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..6 {
        let backend = backends[t % backends.len()].clone();
        let rec = history.process();
        let (key, resource, stop, killed, grants_after_kill, errors) = (
            key.clone(),
            resource.clone(),
            stop.clone(),
            killed.clone(),
            grants_after_kill.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let ttl = Duration::from_secs(4);
            while !stop.load(Ordering::SeqCst) {
                rec.invoke(Op::Acquire, &key, None);
                let lease = match backend
                    .acquire(&key, ttl, Instant::now() + Duration::from_secs(20))
                    .await
                {
                    Ok(lease) => lease,
                    Err(err) => {
                        rec.failed(Op::Acquire, &key, None);
                        errors.fetch_add(1, Ordering::SeqCst);
                        eprintln!("acquire failed (allowed during the election): {err}");
                        sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                rec.acquired(&key, lease.token(), lease.validity_deadline());
                if killed.load(Ordering::SeqCst) {
                    grants_after_kill.fetch_add(1, Ordering::SeqCst);
                }
                assert!(
                    resource.write(&rec, &key, lease.token(), |v| *v += 1),
                    "the fenced resource rejected a current holder"
                );
                sleep(Duration::from_millis(2)).await;
                rec.invoke(Op::Release, &key, Some(lease.token()));
                match backend.release(&lease).await {
                    Ok(held) => rec.released(&key, lease.token(), held),
                    Err(err) => {
                        rec.failed(Op::Release, &key, Some(lease.token()));
                        errors.fetch_add(1, Ordering::SeqCst);
                        eprintln!("release failed (allowed during the election): {err}");
                    }
                }
            }
        }));
    }
    sleep(Duration::from_millis(1500)).await;
    let grants_before_kill = history.check().grants;
    let leader = {
        let servers = target.servers.lock().await;
        let Servers::Ensemble(ensemble) = &*servers else {
            unreachable!()
        };
        // `leader()` is async; find it by the four-letter word directly.
        ensemble
            .nodes()
            .iter()
            .position(|n| n.mode() == Some(conformance::servers::zookeeper::ZkMode::Leader))
            .expect("a leader")
    };
    {
        let mut servers = target.servers.lock().await;
        let Servers::Ensemble(ensemble) = &mut *servers else {
            unreachable!()
        };
        ensemble
            .node_mut(leader)
            .expect("leader node")
            .process()
            .kill()
            .expect("kill the leader");
    }
    killed.store(true, Ordering::SeqCst);
    let killed_at = Instant::now();
    // Run until grants resume for a while after the election.
    let resume_by = killed_at + Duration::from_secs(30);
    while grants_after_kill.load(Ordering::SeqCst) < 50 && Instant::now() < resume_by {
        sleep(Duration::from_millis(100)).await;
    }
    let resumed_after = killed_at.elapsed();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a contention task hung")
            .expect("a contention task panicked");
    }
    let report = history.check();
    println!(
        "leader #{leader} killed after {grants_before_kill} grants; 50 more grants {resumed_after:?} later; \
         {} errors; {}",
        errors.load(Ordering::SeqCst),
        report.summary()
    );
    assert!(
        report.is_safe_with_fencing(),
        "checker: {} ; overlaps {:?}",
        report.summary(),
        report.overlaps.first()
    );
    assert!(grants_before_kill > 0, "no grants before the kill");
    assert!(
        grants_after_kill.load(Ordering::SeqCst) >= 50,
        "grants did not resume after the leader was killed"
    );
    for (backend, before) in backends.iter().zip(&sessions_before) {
        assert_eq!(
            backend.session_id(),
            *before,
            "a session did not survive the election"
        );
        assert_eq!(backend.session_state(), SessionState::Alive);
    }
    // Nothing left behind: the key is free.
    let lease = backends[0]
        .try_acquire(&key, Duration::from_secs(4))
        .await
        .expect("try_acquire")
        .expect("the key is free after the run");
    assert!(backends[0].release(&lease).await.expect("release"));
}
