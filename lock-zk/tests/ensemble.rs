//! A 3-member ZooKeeper ensemble on loopback: the shared suite, and a
//! contention run during which the leader is killed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use conformance::OrSkip;
use conformance::history::{FencedResource, History, Op};
use conformance::servers::zookeeper::ZkEnsemble;
use lock_core::{LockBackend, LockBackendExt, LockKey, SessionState};
use lock_zk::{ZkBackend, ZkConfig};
use tokio::time::{Instant, sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_on_an_ensemble() {
    common::run_suite_on(common::deployed("zookeeper-ensemble").await).await;
}

/// The session timeout of the leader-kill test: the most a server with
/// 500 ms ticks grants (20 ticks). The client gives up on its own after
/// 7/5 of it without a connection.
const ELECTION_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// When each session lost its connection, got it back, or was lost, as
/// its session signal reported it (times since the leader was killed).
#[derive(Debug, Default)]
struct SessionTimeline {
    disconnected: Option<Duration>,
    reconnected: Option<Duration>,
    lost: Option<(Duration, String)>,
}

/// Follows a session signal until `stop`, recording the first transitions.
async fn follow(
    mut signal: tokio::sync::watch::Receiver<SessionState>,
    killed_at: Arc<std::sync::OnceLock<Instant>>,
    stop: Arc<AtomicBool>,
) -> SessionTimeline {
    let mut timeline = SessionTimeline::default();
    while !stop.load(Ordering::SeqCst) {
        let state = signal.borrow_and_update().clone();
        if let Some(killed_at) = killed_at.get() {
            let at = killed_at.elapsed();
            match state {
                SessionState::Suspect if timeline.disconnected.is_none() => {
                    timeline.disconnected = Some(at);
                }
                SessionState::Alive
                    if timeline.disconnected.is_some() && timeline.reconnected.is_none() =>
                {
                    timeline.reconnected = Some(at);
                }
                SessionState::Lost(reason) if timeline.lost.is_none() => {
                    timeline.lost = Some((at, reason));
                    // Terminal for this session.
                    return timeline;
                }
                _ => {}
            }
        }
        // Wake up now and then to notice the kill and `stop`.
        let _ = tokio::time::timeout(Duration::from_millis(50), signal.changed()).await;
    }
    timeline
}

/// The `srvr` mode line of a server, if it answers with one.
fn mode_of(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let timeout = Duration::from_millis(300);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.write_all(b"srvr").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(|m| m.trim().to_owned())
}

/// Six tasks on three sessions contend for one key while the leader is
/// killed: no two promised windows overlap, tokens strictly increase, and
/// grants continue after the election.
///
/// Sessions: when the surviving members form a quorum again well within the
/// session timeout (the usual case: the timeout is 10 s), every session must
/// survive (same id, signal back to `Alive`, never `Lost`). On a loaded
/// machine the election can take longer than that; then a session may
/// expire, and the test checks that it did so cleanly instead: only after
/// being disconnected for at least the session timeout, reported `Lost` on
/// the leases' session signal, and the backend went on with a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_during_contention() {
    // The ensemble itself, not a deployment: the test finds the leader,
    // kills exactly it and watches the survivors' modes.
    let Some(mut ensemble) = ZkEnsemble::start(3).await.or_skip() else {
        return;
    };
    let url = format!(
        "{}?session_timeout={}ms&timeout=3s&connect_timeout=15s",
        ensemble.url(),
        ELECTION_SESSION_TIMEOUT.as_millis()
    );
    let backends: Vec<Arc<lock_zk::ZkBackend>> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            let config = ZkConfig::from_url(&url).expect("config");
            out.push(Arc::new(ZkBackend::connect(config).await.expect("backend")));
        }
        out
    };
    for backend in &backends {
        assert_eq!(backend.session_timeout(), Some(ELECTION_SESSION_TIMEOUT));
    }
    let sessions_before: Vec<Option<i64>> = backends.iter().map(|b| b.session_id()).collect();
    let key = LockKey::new(format!("leader-kill-{}", std::process::id())).expect("key");
    // One bare lease per session on a side key: its session signal shows
    // what happens to the session during the election.
    let stop_following = Arc::new(AtomicBool::new(false));
    let killed_at = Arc::new(std::sync::OnceLock::new());
    let mut probes = Vec::new();
    let mut followers = Vec::new();
    for (i, backend) in backends.iter().enumerate() {
        let side = LockKey::new(format!("{}-probe-{i}", key.as_str())).expect("key");
        let probe = backend
            .try_acquire(&side, Duration::from_secs(4))
            .await
            .expect("probe")
            .expect("probe key free");
        let signal = probe.session().expect("session signal").clone();
        followers.push(tokio::spawn(follow(
            signal,
            killed_at.clone(),
            stop_following.clone(),
        )));
        probes.push(probe);
    }
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
    let (leader, survivors) = {
        // `leader()` is async; find it by the four-letter word directly.
        let leader = ensemble
            .nodes()
            .iter()
            .position(|n| n.mode() == Some(conformance::servers::zookeeper::ZkMode::Leader))
            .expect("a leader");
        let survivors: Vec<u16> = ensemble
            .nodes()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .map(|(_, n)| n.client_port())
            .collect();
        ensemble
            .node_mut(leader)
            .expect("leader node")
            .process()
            .kill()
            .expect("kill the leader");
        (leader, survivors)
    };
    killed.store(true, Ordering::SeqCst);
    let kill_instant = Instant::now();
    killed_at.set(kill_instant).expect("set once");
    // When the two survivors serve again as leader and follower.
    let quorum = tokio::task::spawn_blocking(move || {
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < give_up {
            let mut modes: Vec<String> = survivors.iter().filter_map(|p| mode_of(*p)).collect();
            modes.sort();
            if modes == ["follower", "leader"] {
                return Some(kill_instant.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    });
    // Run until grants resume for a while after the election.
    let resume_by = kill_instant + Duration::from_secs(40);
    while grants_after_kill.load(Ordering::SeqCst) < 50 && Instant::now() < resume_by {
        sleep(Duration::from_millis(100)).await;
    }
    let resumed_after = kill_instant.elapsed();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a contention task hung")
            .expect("a contention task panicked");
    }
    let quorum_after = quorum.await.expect("quorum probe");
    stop_following.store(true, Ordering::SeqCst);
    let mut timelines = Vec::new();
    for follower in followers {
        timelines.push(follower.await.expect("session follower"));
    }
    let report = history.check();
    println!(
        "leader #{leader} killed after {grants_before_kill} grants; quorum again after \
         {quorum_after:?}; 50 more grants {resumed_after:?} later; {} errors; {}",
        errors.load(Ordering::SeqCst),
        report.summary()
    );
    for (i, timeline) in timelines.iter().enumerate() {
        println!("session {i}: {timeline:?}");
    }
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
    let quorum_after = quorum_after.expect("the survivors never formed a quorum again");
    // A quorum within half the session timeout leaves the clients at least
    // 5 s to reconnect: every session must then survive.
    let must_survive = quorum_after < ELECTION_SESSION_TIMEOUT / 2;
    for (i, (timeline, backend)) in timelines.iter().zip(&backends).enumerate() {
        match &timeline.lost {
            None => {
                assert_eq!(
                    backend.session_id(),
                    sessions_before[i],
                    "session {i}: a new session without the old one reported lost"
                );
                assert!(
                    timeline.reconnected.is_some() || timeline.disconnected.is_none(),
                    "session {i} never reconnected: {timeline:?}"
                );
                assert_eq!(backend.session_state(), SessionState::Alive);
                assert_eq!(
                    *probes[i].session().expect("signal").borrow(),
                    SessionState::Alive
                );
            }
            Some((lost_at, reason)) => {
                assert!(
                    !must_survive,
                    "session {i} lost ({reason}) {lost_at:?} after the kill although the \
                     ensemble served again {quorum_after:?} after it: {timeline:?}"
                );
                // Expired cleanly: only after a disconnection of at least
                // the session timeout, reported on the leases' signal, and
                // the backend went on with a new session.
                let disconnected = timeline.disconnected.unwrap_or_default();
                assert!(
                    *lost_at >= disconnected + ELECTION_SESSION_TIMEOUT,
                    "session {i} lost after a disconnection shorter than its timeout: {timeline:?}"
                );
                assert!(reason.contains("expired"), "session {i}: {reason}");
                assert!(matches!(
                    *probes[i].session().expect("signal").borrow(),
                    SessionState::Lost(_)
                ));
                // Its node went with the session.
                assert_eq!(
                    backend.renew(&probes[i]).await.unwrap_err().kind(),
                    lock_core::ErrorKind::NotHeld
                );
            }
        }
    }
    // Nothing left behind: the key is free, and every backend works (on a
    // new session where the old one expired).
    for (i, backend) in backends.iter().enumerate() {
        let lease = backend
            .try_acquire(&key, Duration::from_secs(4))
            .await
            .expect("try_acquire")
            .expect("the key is free after the run");
        assert_eq!(backend.session_state(), SessionState::Alive);
        if timelines[i].lost.is_some() {
            assert_ne!(backend.session_id(), sessions_before[i], "a new session");
        }
        assert!(backend.release(&lease).await.expect("release"));
    }
    for (probe, backend) in probes.iter().zip(&backends) {
        let _ = backend.release(probe).await;
    }
}
